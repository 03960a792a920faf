// Package peek holds every read of another library's unexported fields and
// type names that the inbox's run-time checks make: watermill-sql's
// Publisher (its db and its config's SchemaAdapter), its v4 adapters and
// its context key, Watermill's forwarder (wrappedPublisher), and the
// standard library's contexts (their parent and key fields).
//
// Each read names the versions it was checked against, and a test per
// supported version asserts that it still finds what it reads: this
// package's tests for Watermill and the standard library, the test rig's
// (internal/testing/peek) for watermill-sql v3 and v4, which the library
// does not link. An upgrade that moves a field fails a test there, instead
// of silently turning a check off: every caller treats a read that finds
// nothing as "not that library's", so the check goes quiet.
package peek
