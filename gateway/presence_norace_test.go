//go:build !race

package gateway_test

// massReconnectMembers is the mass reconnect: 1,000 members.
const massReconnectMembers = 1000
