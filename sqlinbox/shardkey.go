package sqlinbox

import (
	"fmt"
	"slices"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// MaxShardKeyLength is the longest shard key, in bytes, a claim stores in
// [Config.ShardKeyColumn]: the column is VARBINARY(255).
const MaxShardKeyLength = 255

// ErrShardKey is wrapped by the error of a claim whose shard key does not
// fit the store: empty or longer than [MaxShardKeyLength] when the table has
// a [Config.ShardKeyColumn], set when it has none. Nothing is written. It is
// [inboxdriver.ErrInvalidShardKey], so the middleware reports it permanent.
var ErrShardKey = inboxdriver.ErrInvalidShardKey

// columnNames are the inbox table's own columns, which a shard key column
// must not shadow.
var columnNames = []string{"consumer", "event_id", "processed_at", "fingerprint", "event_time"}

// checkShardKeyColumn validates [Config.ShardKeyColumn].
func checkShardKeyColumn(c Config) error {
	col := c.ShardKeyColumn
	if col == "" {
		return nil
	}
	if c.Dialect != MySQL {
		return fmt.Errorf("ShardKeyColumn is for MySQL sharded by Vitess, not %s", c.Dialect)
	}
	if len(col) > maxIdentifierLength || !identifierPattern.MatchString(col) {
		return fmt.Errorf("ShardKeyColumn %q: lowercase letters, digits and underscores, not starting with a digit, at most %d bytes", col, maxIdentifierLength)
	}
	if slices.Contains(columnNames, col) {
		return fmt.Errorf("ShardKeyColumn %q is a column the inbox table already has; name another", col)
	}
	return nil
}

// CheckShardKeys implements [inboxdriver.ShardKeyChecker]: claims carry a
// shard key (keyed) exactly when the table has a [Config.ShardKeyColumn],
// so that a middleware configured otherwise is refused at its start rather
// than failing every claim.
func (s *Store) CheckShardKeys(keyed bool) error {
	col := s.config.ShardKeyColumn
	switch {
	case keyed && col == "":
		return fmt.Errorf("%w: %s has no shard key column; set sqlinbox.Config.ShardKeyColumn, or no shard key", ErrShardKey, s.table)
	case !keyed && col != "":
		return fmt.Errorf("%w: %s stores a shard key in column %s; set inbox.Config.ShardKey", ErrShardKey, s.table, col)
	}
	return nil
}
