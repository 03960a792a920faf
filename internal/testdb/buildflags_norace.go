//go:build !race

package testdb

// BuildFlags build a command the way this test binary was built, here
// without the race detector, so that a test building one finds its
// packages compiled already.
var BuildFlags []string
