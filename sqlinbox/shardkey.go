package sqlinbox

import (
	"errors"
	"fmt"
	"slices"
)

// MaxShardKeyLength is the longest shard key, in bytes, a claim stores in
// [Config.ShardKeyColumn]: the column is VARBINARY(255).
const MaxShardKeyLength = 255

// ErrShardKey is wrapped by the error of a claim whose shard key does not
// fit the store: empty or longer than [MaxShardKeyLength] when the table has
// a [Config.ShardKeyColumn], set when it has none. Nothing is written.
var ErrShardKey = errors.New("sqlinbox: invalid shard key")

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
