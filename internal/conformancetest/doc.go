// Package conformancetest is the behaviour every dialect and driver must show
// behind the inbox middleware: one suite, run by sqlinbox's tests against
// each real database. Differences between databases are Target fields, not
// branches scattered through the tests.
//
// It is a test helper, not shipped: only tests (and the test rig in
// internal/testing) import it, and depstest's
// TestShippedCodeLinksNoTestHelper fails if a package of the library links
// it.
package conformancetest
