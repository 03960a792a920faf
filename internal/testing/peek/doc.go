// Package peek checks the reads of watermill-sql's internals that the
// library's package internal/peek makes, on every major version the
// library supports (v3 and v4, as this module's go.mod pins them). The
// library does not link watermill-sql, so these tests live here. The
// package has no code of its own.
package peek
