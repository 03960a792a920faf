package purge

import (
	"fmt"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// ErrSkipped is returned by [Purger.PurgeOnce] and [Purger.DryRun] when
// another purge of the same table holds the purge lock (in this or another
// process). Nothing was done, and nothing needs doing: that purge is doing
// the work. [Purger.Run] and the inbox command (inbox purge) treat it as
// success. The error returned wraps it with the lock's holder and, where
// the database tells, how long it has held the lock.
//
// Test for it with [errors.Is]. Its type also has a method Skipped() bool
// that returns true, for code that must not import this package (and the
// store packages behind it): [prommetrics] finds it with [errors.As], as
// one finds [net.Error]'s Timeout.
//
// [prommetrics]: https://pkg.go.dev/github.com/watermill-inbox/inbox/prommetrics
var ErrSkipped error = skippedError{}

type skippedError struct{}

func (skippedError) Error() string { return "purge: another purge of this table is running; skipped" }

// Skipped reports that the round did nothing because another purge of the
// table was running.
func (skippedError) Skipped() bool { return true }

// ErrTableMismatch is returned by [Purger.PurgeOnce] and [Purger.DryRun],
// before anything is deleted, when the table's times cannot be compared
// correctly with the purge's cutoff: a time column of the wrong type (MySQL
// TIMESTAMP, PostgreSQL timestamp without time zone) or, on SQLite, rows
// whose processed_at is text in another form than the one the claims write.
// Purging such a table would delete rows still inside the retention. What
// compares alike is accepted: timestamptz at any precision or under a
// domain, DATETIME at any precision; inbox check judges the column alike. The error says what is wrong
// and how to migrate; a purger checks again each round until the table
// passes, then never again. A check that cannot read the catalog does not
// stop the purge: it is logged once and the rounds go on. Test for it with
// [errors.Is].
var ErrTableMismatch = maintenance.ErrTableMismatch

// skipped is [ErrSkipped] saying who holds the lock and, where the database
// tells, for how long: a lock held for hours is a round stuck, not one
// under way.
func skipped(busy *maintenance.Busy) error {
	return fmt.Errorf("%w: %s", ErrSkipped, busy)
}
