package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

var _ purgeDialect = sqlite{}

func (sqlite) purgeQueries(t tableName, _ Config) purgeQueries {
	table := t.quoted('"')
	question := func(int) string { return "?" }
	// processed_at is ISO 8601 UTC text, which sorts as it compares; the
	// cutoff is built the same way from the database clock.
	const expired = `processed_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || (? / 1000000.0) || ' seconds')`
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
	}
}

// lockPurge takes no lock: SQLite lets one writer at a time, so concurrent
// purges take turns batch by batch and never delete a row twice.
func (sqlite) lockPurge(context.Context, *sql.DB, tableName) (purgeLock, *maintenance.Busy, error) {
	return nil, nil, nil
}

// purgeLimits has no limit: SQLite has no statement timeout (its busy
// timeout is the DSN's) and no partitions.
func (sqlite) purgeLimits() maintenance.Limits { return maintenance.Limits{} }

// statementTimedOut reports a batch that waited longer than the busy
// timeout for the write lock. SQLite has no statement timeout, but this is
// the purge's equivalent: claims hold the lock, so the purge backs off with
// a smaller batch instead of failing the round (classify would call it an
// event in flight, which is a claim's reason, not the purge's).
func (sqlite) statementTimedOut(err error) bool { return sqliteBusyErr(err) }
