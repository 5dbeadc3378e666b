//go:build !race

package main

// stormTestN is the sessions of the drain end-to-end test.
const stormTestN = 2000
