// Package servicetest is the body of the small services that tests run as
// separate programs, each from a main package of its own, so that each has
// the service name a real deployment would have: its main package path.
// Every service consumes the same orders with a handler named
// "handle_orders" into one inbox table, as two services subscribed to one
// topic would, and prints what the inbox did with them as one JSON line.
//
// It is a test helper, not shipped: only tests (and the test rig in
// internal/testing) import it, and depstest's
// TestShippedCodeLinksNoTestHelper fails if a package of the library links
// it.
package servicetest
