package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// OldestClaim returns when the oldest row still in the table was claimed, by
// the database clock, in UTC; ok is false for an empty table. It reads one
// entry of the processed_at index (of each partition, for a partitioned
// table), so it is cheap enough for every metrics scrape. An oldest claim
// much older than the purge retention means the purge is not running.
func (s *Store) OldestClaim(ctx context.Context) (oldest time.Time, ok bool, err error) {
	var text sql.NullString
	if err := s.db.QueryRowContext(ctx, s.q.oldest).Scan(&text); err != nil {
		return time.Time{}, false, fmt.Errorf("sqlinbox: reading the oldest claim of %s: %w", s.table, s.dialect.classify(err))
	}
	if !text.Valid {
		return time.Time{}, false, nil
	}
	at, err := time.Parse(time.RFC3339Nano, text.String)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("sqlinbox: reading the oldest claim of %s: %w", s.table, err)
	}
	return at.UTC(), true, nil
}
