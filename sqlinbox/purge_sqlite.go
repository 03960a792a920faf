package sqlinbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

var _ purgeDialect = sqlite{}

func (sqlite) purgeQueries(t tableName, _ Config) purgeQueries {
	table := t.quoted('"')
	question := func(int) string { return "?" }
	// processed_at is ISO 8601 UTC text, which sorts as it compares; the
	// cutoff is built the same way from the database clock. Text in
	// another form does not sort as time: CheckTable refuses a table with
	// such rows, and rows written later in another form are never deleted
	// (nor counted).
	expired := `processed_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || (? / 1000000.0) || ' seconds') AND ` + sqliteCanonicalTime("processed_at")
	return purgeQueries{
		// No lock: SQLite lets one writer at a time, so concurrent purges
		// take turns batch by batch and never delete a row twice.
		deleteBatch: func(s scopeShape, _ time.Duration) string {
			// The table has no rowid (WITHOUT ROWID): select the batch by
			// its key, oldest first through the processed_at index.
			return fmt.Sprintf(`DELETE FROM %[1]s WHERE (consumer, event_id) IN (
	SELECT consumer, event_id FROM %[1]s WHERE %[2]s%[3]s ORDER BY processed_at LIMIT ?)`,
				table, expired, scopeFilter(s, question, 2))
		},
		countExpired: func(s scopeShape) string {
			return fmt.Sprintf(`SELECT consumer, COUNT(*) FROM %s WHERE %s%s GROUP BY consumer`, table, expired, scopeFilter(s, question, 2))
		},
		waitForBatch: sqlitePollWriteLock,
	}
}

// sqlitePollWriteLock runs a batch's attempt, trying again every few
// hundred microseconds, at random, while the write lock is taken, for as
// long as the connection's busy_timeout, whose own retries it replaces for
// the batch. SQLite's busy handler sleeps longer and longer (1, 2, 5, 10
// ... 100 ms) between two looks at the lock, at fixed steps: behind
// claims that keep taking it, a purge batch waited 280 to 540 ms on
// average on two busy cores, often its whole busy timeout, and the purge
// then shrank its batches to the minimum. Polling, a batch waited 14 ms at
// the median. The connection's busy_timeout is put back before the batch
// returns: it goes back to the pool claims use.
func sqlitePollWriteLock(ctx context.Context, conn *sql.Conn, attempt func() (int64, error)) (n int64, err error) {
	var ms int64
	if err := conn.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&ms); err != nil {
		return 0, err
	}
	if _, err := conn.ExecContext(ctx, `PRAGMA busy_timeout = 0`); err != nil {
		return 0, err
	}
	defer func() {
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), fmt.Sprintf(`PRAGMA busy_timeout = %d`, ms)); rerr != nil {
			// Not back in the pool with no busy timeout.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			err = errors.Join(err, rerr)
		}
	}()
	deadline := time.Now().Add(time.Duration(ms) * time.Millisecond)
	for {
		n, err := attempt()
		if !errors.Is(err, maintenance.ErrPurgeTimeout) || !time.Now().Before(deadline) {
			return n, err
		}
		t := time.NewTimer(200*time.Microsecond + rand.N(800*time.Microsecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
	}
}

// lockPurge takes no lock: SQLite lets one writer at a time, so concurrent
// purges take turns batch by batch and never delete a row twice.
func (sqlite) lockPurge(context.Context, *sql.DB, tableName) (purgeLock, *maintenance.Busy, error) {
	return nil, nil, nil
}

// purgeLimits has no limit: SQLite has no statement timeout (its busy
// timeout is the DSN's) and no partitions. It has one writer.
func (sqlite) purgeLimits() maintenance.Limits { return maintenance.Limits{OneWriter: true} }

// statementTimedOut reports a batch that waited longer than the busy
// timeout for the write lock. SQLite has no statement timeout, but this is
// the purge's equivalent: claims hold the lock, so the purge backs off with
// a smaller batch instead of failing the round (classify would call it an
// event in flight, which is a claim's reason, not the purge's).
func (sqlite) statementTimedOut(err error) bool { return sqliteBusyErr(err) }
