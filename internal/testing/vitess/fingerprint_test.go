package vitess_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// A duplicate's claim reads the original's fingerprint in its own
// transaction, under transaction_mode SINGLE: that read must reach the
// claim's shard alone, so it names the vindex column (the shard key, or
// event_id); a read by consumer and event id alone would scatter to every
// shard and be refused.
func TestFingerprintOfADuplicate(t *testing.T) {
	t.Parallel()
	for _, layout := range []struct {
		name, column, vindex string
		config               sqlinbox.Config
	}{
		{"sharded by a shard key", "shard_key", "hash", sqlinbox.Config{ShardKeyColumn: "shard_key", Fingerprints: true}},
		{"sharded by event id", "event_id", "xxhash", sqlinbox.Config{Fingerprints: true}},
	} {
		t.Run(layout.name, func(t *testing.T) {
			t.Parallel()
			db := open(t)
			store := newStore(t, db, layout.config, layout.column, layout.vindex)
			for i := range 20 {
				id, key := fmt.Sprintf("event-%d", i), ""
				if store.ShardKeyColumn() != "" {
					key = fmt.Sprint(1 + i%customers)
				}
				tx, _, err := store.Claim(t.Context(), inboxdriver.Claim{Consumer: "billing", EventID: id, ShardKey: key, Fingerprint: []byte("first")})
				require.NoError(t, err)
				require.NotNil(t, tx)
				require.NoError(t, tx.Commit(t.Context()))
				tx, stored, err := store.Claim(t.Context(), inboxdriver.Claim{Consumer: "billing", EventID: id, ShardKey: key, Fingerprint: []byte("second")})
				require.NoError(t, err)
				require.Nil(t, tx, "a duplicate")
				require.Equal(t, "first", string(stored))
			}
		})
	}
}

// vtgate answers SHOW SESSION STATUS from another connection than the
// transaction's, so the count of the transaction's writes, which the
// middleware's check of a produced-message publisher reads, is not there:
// the store says it cannot tell.
func TestTransactionWritesCannotBeCounted(t *testing.T) {
	t.Parallel()
	db := open(t)
	store := newStore(t, db, sqlinbox.Config{ShardKeyColumn: "shard_key"}, "shard_key", "hash")
	tx, _, err := store.Claim(t.Context(), inboxdriver.Claim{Consumer: "billing", EventID: "event-1", ShardKey: "7"})
	require.NoError(t, err)
	require.NotNil(t, tx)
	defer tx.Rollback(t.Context()) //nolint:errcheck // the test only reads
	_, ok, err := store.CountTxWrites(t.Context(), tx)
	require.NoError(t, err)
	require.False(t, ok)
}
