//go:build race

package testdb

// BuildFlags build a command the way this test binary was built, here with
// the race detector, so that a test building one finds its packages
// compiled already.
var BuildFlags = []string{"-race"}
