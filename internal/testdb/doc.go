// Package testdb hands tests real databases: connections from environment
// variables with localhost defaults, and table names unique to each test so
// tests run in parallel on one database. The repository's test.sh starts
// throwaway servers when none answers and exports these variables.
//
// It is a test helper, not shipped: only tests (and the test rig in
// internal/testing) import it, and depstest's
// TestShippedCodeLinksNoTestHelper fails if a package of the library links
// it.
package testdb
