package inbox

import (
	"fmt"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// ErrInvalidShardKey means [Config.ShardKey] failed or gave a key the store
// cannot keep: empty or too long for its shard key column. Permanent: every
// copy of the event gets the same key.
var ErrInvalidShardKey = inboxdriver.ErrInvalidShardKey

// checkShardKeys refuses, at [NewMiddleware], a [Config.ShardKey] on a store
// without a shard key column and a store with one without the function:
// every claim would fail.
func checkShardKeys(c Config) error {
	keyed := c.ShardKey != nil
	sk, ok := c.Store.(inboxdriver.ShardKeyChecker)
	if !ok {
		if keyed {
			return fmt.Errorf("ShardKey: the store (%T) cannot keep shard keys", c.Store)
		}
		return nil
	}
	if err := sk.CheckShardKeys(keyed); err != nil {
		return fmt.Errorf("ShardKey: %w", err)
	}
	return nil
}
