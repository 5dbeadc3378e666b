//go:build !race

package main

// stormTestN is the sessions of the drain end-to-end test.
const stormTestN = 2000

// stormPeakSlack is 1: the bound, 1.5·n/spread accepts per second.
const stormPeakSlack = 1.0
