//go:build race

package gateway_test

// massReconnectMembers is smaller under the race detector, which makes
// each session's frames several times as costly.
const massReconnectMembers = 200
