package vitess_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Stream sizes: every event delivered copies times by workers at once.
const (
	streamEvents  = 500
	streamCopies  = 4
	streamWorkers = 8
	customers     = 40
)

// The inbox sharded by a shard key column with the hash vindex of the
// effect table's customer_id: each claim lands on the shard of its
// event's effect, so under transaction_mode SINGLE every transaction
// stays on one shard and commits, and each event has exactly one effect,
// beside its claim.
func TestClaimOnTheShardOfTheEffect(t *testing.T) {
	t.Parallel()
	db := open(t)
	store := newStore(t, db, sqlinbox.Config{ShardKeyColumn: "shard_key"}, "shard_key", "hash")
	effects := newEffects(t, db)
	events := newEvents(streamEvents, customers)
	c := deliver(t, store, db, effects, events, streamCopies, streamWorkers)
	t.Logf("%d events x %d copies: %s", len(events), streamCopies, c)
	c.requireNoFailure(t)
	require.EqualValues(t, len(events), c.committed.Load())
	require.EqualValues(t, len(events)*(streamCopies-1), c.duplicates.Load())

	claims, done := perShard(t, store.Table(), "event_id"), perShard(t, effects, "event_id")
	t.Logf("claims per shard: %s; effects per shard: %s", counts(claims), counts(done))
	var all []string
	for _, shard := range vt.Shards() {
		require.NotEmpty(t, claims[shard], "no claim on shard %s", shard)
		slices.Sort(claims[shard])
		slices.Sort(done[shard])
		require.Equal(t, claims[shard], done[shard], "shard %s: claims and effects differ", shard)
		all = append(all, done[shard]...)
	}
	require.Len(t, all, len(events), "one effect per event")
	slices.Sort(all)
	require.Len(t, slices.Compact(all), len(events))
}

// The inbox sharded by event_id and the effect by customer: the
// transactions whose effect lies on the other shard are refused by
// vtgate (transaction_mode SINGLE) at the effect's INSERT and roll back,
// claim included; none commits shard by shard. The others commit, once.
func TestClaimAndEffectOnTwoShardsIsRefused(t *testing.T) {
	t.Parallel()
	db := open(t)
	store := newStore(t, db, sqlinbox.Config{}, "event_id", "xxhash")
	effects := newEffects(t, db)
	events := newEvents(100, customers)
	c := deliver(t, store, db, effects, events, 2, streamWorkers)
	t.Logf("%d events x 2 copies: %s", len(events), c)
	require.NotEmpty(t, c.failed, "no event had its effect on another shard than its claim")
	for id, err := range c.failed {
		var me *mysql.MySQLError
		require.True(t, errors.As(err, &me), "event %s: %v", id, err)
		require.EqualValues(t, 1317, me.Number, "event %s: %v", id, err)
		require.Contains(t, me.Message, "multi-db transaction attempted")
	}
	claims, done := perShard(t, store.Table(), "event_id"), perShard(t, effects, "event_id")
	t.Logf("claims per shard: %s; effects per shard: %s", counts(claims), counts(done))
	committed := map[string]bool{}
	for _, shard := range vt.Shards() {
		slices.Sort(claims[shard])
		slices.Sort(done[shard])
		require.Equal(t, claims[shard], done[shard], "shard %s: a claim without its effect, or an effect without its claim", shard)
		for _, id := range claims[shard] {
			committed[id] = true
		}
	}
	require.Len(t, committed, len(events)-len(c.failed))
	for id := range c.failed {
		require.False(t, committed[id], "event %s failed and has a claim", id)
	}
	require.EqualValues(t, len(committed), c.committed.Load())
}

// A vtgate session in transaction_mode MULTI would commit such a
// transaction shard by shard: the store refuses to claim there, and
// writes nothing.
func TestMultiTransactionModeIsRefused(t *testing.T) {
	t.Parallel()
	db := open(t)
	store := newStore(t, db, sqlinbox.Config{}, "event_id", "xxhash")
	multi := open(t, "transaction_mode=%27multi%27")
	var mode string
	require.NoError(t, multi.QueryRow("SELECT @@transaction_mode").Scan(&mode))
	require.Equal(t, "MULTI", mode)
	onMulti, err := sqlinbox.New(multi, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: store.Table()})
	require.NoError(t, err)
	tx, _, err := onMulti.Claim(t.Context(), inboxdriver.Claim{Consumer: "billing", EventID: "event-1"})
	require.ErrorIs(t, err, sqlinbox.ErrVitessMultiTransactions)
	require.Nil(t, tx)
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM "+store.Table()).Scan(&n))
	require.Zero(t, n)

	// The same table through a SINGLE session claims.
	tx, _, err = store.Claim(t.Context(), inboxdriver.Claim{Consumer: "billing", EventID: "event-1"})
	require.NoError(t, err)
	require.NotNil(t, tx)
	require.NoError(t, tx.Commit(t.Context()))
}
