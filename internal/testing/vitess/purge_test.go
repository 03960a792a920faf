package vitess_test

import (
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

const day = 24 * time.Hour

// seed inserts n claims of consumer processed age ago, of customers 1 to
// customers (the shard key), through vtgate: each INSERT goes to its
// row's shard.
func seed(t testing.TB, db *sql.DB, store *sqlinbox.Store, consumer string, n int, age time.Duration) {
	t.Helper()
	stmt := fmt.Sprintf("INSERT INTO %s (consumer, event_id, %s, processed_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6) - INTERVAL ? SECOND)", store.Table(), store.ShardKeyColumn())
	for i := range n {
		_, err := db.Exec(stmt, consumer, fmt.Sprintf("%s-%d-%d", consumer, age/time.Hour, i), strconv.Itoa(1+i%customers), int64(age/time.Second))
		require.NoError(t, err)
	}
}

// The purge through vtgate: two purgers at once, one holding the named
// lock, batches of the smallest size, a consumer with a longer retention.
// The expired rows go from both shards, the others stay.
func TestPurge(t *testing.T) {
	t.Parallel()
	db := open(t)
	store := newStore(t, db, sqlinbox.Config{ShardKeyColumn: "shard_key"}, "shard_key", "hash")
	seed(t, db, store, "billing", 330, 30*day)
	seed(t, db, store, "billing", 40, time.Hour)
	seed(t, db, store, "mailer", 50, 30*day)
	before := perShard(t, store.Table(), "event_id")
	for _, shard := range vt.Shards() {
		require.Greater(t, len(before[shard]), 100, "shard %s", shard)
	}

	config := purge.Config{Retention: 14 * day, ConsumerRetention: map[string]time.Duration{"mailer": 60 * day}, BatchSize: purge.MinBatchSize}
	var (
		wg             sync.WaitGroup
		mu             sync.Mutex
		removed, skips int64
		errs           []error
	)
	for range 2 {
		p, err := purge.New(store, config)
		require.NoError(t, err)
		wg.Go(func() {
			n, err := p.PurgeOnce(t.Context())
			mu.Lock()
			defer mu.Unlock()
			removed += n
			switch {
			case errors.Is(err, purge.ErrSkipped):
				skips++
			case err != nil:
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	require.Empty(t, errs)
	require.EqualValues(t, 330, removed, "%d of the rounds skipped", skips)
	after := perShard(t, store.Table(), "event_id")
	t.Logf("rows per shard before the purge: %s; after: %s; %d of 2 rounds skipped", counts(before), counts(after), skips)
	var billing, mailer int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM "+store.Table()+" WHERE consumer = 'billing'").Scan(&billing))
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM "+store.Table()+" WHERE consumer = 'mailer'").Scan(&mailer))
	require.Equal(t, 40, billing)
	require.Equal(t, 50, mailer)

	// A session holding the table's purge lock (vtgate keeps a lock
	// function's session on one shard) makes a round skip, naming it.
	sess, busy, err := store.Maintenance().BeginPurge(t.Context())
	require.NoError(t, err)
	require.Nil(t, busy)
	p, err := purge.New(store, config)
	require.NoError(t, err)
	_, err = p.PurgeOnce(t.Context())
	require.ErrorIs(t, err, purge.ErrSkipped)
	require.ErrorContains(t, err, "MySQL connection")
	require.NoError(t, sess.Close())
	n, err := p.PurgeOnce(t.Context())
	require.NoError(t, err)
	require.Zero(t, n)
}
