// Package depstest checks what a package links, so that a program importing
// it gets no database driver or library it did not ask for: a driver linked
// is also a driver registered with database/sql.
//
// It is a test helper, not shipped: only tests (and the test rig in
// internal/testing) import it, and depstest's
// TestShippedCodeLinksNoTestHelper fails if a package of the library links
// it.
package depstest
