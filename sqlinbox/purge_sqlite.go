package sqlinbox

import (
	"fmt"
	"time"
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

// statementTimedOut is always false: SQLite has no statement timeout, and a
// busy database is reported as inbox.ErrInFlight by classify.
func (sqlite) statementTimedOut(error) bool { return false }
