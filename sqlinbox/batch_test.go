package sqlinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// batchTargets are the stores ClaimBatch is tested on: every dialect and
// driver, and every PostgreSQL table layout.
func batchTargets() []struct {
	name string
	open func(t testing.TB) *sql.DB
	cfg  sqlinbox.Config
} {
	pg := func(driver string) func(t testing.TB) *sql.DB {
		return func(t testing.TB) *sql.DB { return testdb.Postgres(t, driver) }
	}
	return []struct {
		name string
		open func(t testing.TB) *sql.DB
		cfg  sqlinbox.Config
	}{
		{"PostgreSQL/lib-pq", pg("postgres"), sqlinbox.Config{Dialect: sqlinbox.PostgreSQL}},
		{"PostgreSQL/pgx-stdlib/uuid/claim-timeout", pg("pgx"), sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, UUIDEventIDs: true, ClaimTimeout: time.Minute}},
		{"PostgreSQL/lib-pq/daily-partitions", pg("postgres"), sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Daily, ClaimTimeout: time.Minute}},
		{"PostgreSQL/pgx-stdlib/event-time-partitions", pg("pgx"), sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Daily, PartitionKey: sqlinbox.EventIDTime, UUIDEventIDs: true}},
		{"PostgreSQL/pgbouncer/lib-pq", func(t testing.TB) *sql.DB { return testdb.PgBouncer(t, "postgres") }, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, TransactionPooling: true}},
		{"MySQL", testdb.MySQL, sqlinbox.Config{Dialect: sqlinbox.MySQL}},
		{"MySQL/uuid/claim-timeout", testdb.MySQL, sqlinbox.Config{Dialect: sqlinbox.MySQL, UUIDEventIDs: true, ClaimTimeout: time.Minute}},
		{"SQLite", testdb.SQLite, sqlinbox.Config{Dialect: sqlinbox.SQLite, Fingerprints: true}},
	}
}

// batchIDs returns n ids for the store: UUIDv7s, which every layout takes.
func batchIDs(label string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = testdb.UUIDv7(time.Now(), fmt.Sprintf("%s-%d", label, i))
	}
	return ids
}

// TestClaimBatch claims a batch whose events are partly claimed already:
// exactly the others are new, in the batch's order; the committed batch
// again is all duplicates, with no transaction left open.
func TestClaimBatch(t *testing.T) {
	t.Parallel()
	for _, target := range batchTargets() {
		t.Run(target.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := target.open(t)
			cfg := target.cfg
			cfg.Table = testdb.Table(t, db, "inbox")
			store, err := sqlinbox.New(db, cfg)
			require.NoError(t, err)
			require.NoError(t, store.CreateSchema(ctx))

			ids := batchIDs(t.Name(), 7)
			for _, id := range []string{ids[1], ids[4]} {
				tx, _, err := store.Claim(ctx, inboxdriver.Claim{Consumer: "c", EventID: id})
				require.NoError(t, err)
				require.NoError(t, tx.Commit(ctx))
			}
			// Out of order, as a subscriber delivers them.
			batch := []string{ids[6], ids[4], ids[0], ids[2], ids[1], ids[5], ids[3]}
			tx, claimed, err := store.ClaimBatch(ctx, inboxdriver.BatchClaim{Consumer: "c", EventIDs: batch})
			require.NoError(t, err)
			require.NotNil(t, tx)
			require.Equal(t, []bool{true, false, true, true, false, true, true}, claimed)
			require.NoError(t, tx.Commit(ctx))

			tx, claimed, err = store.ClaimBatch(ctx, inboxdriver.BatchClaim{Consumer: "c", EventIDs: batch})
			require.NoError(t, err)
			require.Nil(t, tx)
			require.Equal(t, make([]bool, len(batch)), claimed)

			// Another consumer's claims are its own.
			tx, claimed, err = store.ClaimBatch(ctx, inboxdriver.BatchClaim{Consumer: "other", EventIDs: batch[:2]})
			require.NoError(t, err)
			require.Equal(t, []bool{true, true}, claimed)
			require.NoError(t, tx.Rollback(ctx))

			var n int
			require.NoError(t, db.QueryRow("SELECT count(*) FROM "+cfg.Table).Scan(&n))
			require.Equal(t, 7, n)
			require.Equal(t, 0, db.Stats().InUse, "a connection left in a transaction")
		})
	}
}

// TestClaimBatchRefuses: a batch with an id twice, an invalid id, or none
// is refused before any SQL.
func TestClaimBatchRefuses(t *testing.T) {
	t.Parallel()
	store, err := sqlinbox.New(testdb.SQLite(t), sqlinbox.Config{Dialect: sqlinbox.SQLite, UUIDEventIDs: true})
	require.NoError(t, err)
	id := batchIDs(t.Name(), 1)[0]
	for _, ids := range [][]string{nil, {id, id}, {id, "not-a-uuid"}, {""}} {
		_, _, err := store.ClaimBatch(context.Background(), inboxdriver.BatchClaim{Consumer: "c", EventIDs: ids})
		require.Error(t, err, "%q", ids)
	}
	_, _, err = store.ClaimBatch(context.Background(), inboxdriver.BatchClaim{Consumer: "c", EventIDs: []string{"not-a-uuid"}})
	require.ErrorIs(t, err, inboxdriver.ErrInvalidEventID)
}

// TestClaimBatchRacesWithoutDeadlock: workers claim batches of the same
// events, each given them in another order, while the first holds its
// claims: every event is claimed by exactly one batch and no worker sees a
// deadlock, since every batch claims in one order.
func TestClaimBatchRacesWithoutDeadlock(t *testing.T) {
	t.Parallel()
	for _, target := range batchTargets() {
		t.Run(target.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cfg := target.cfg
			cfg.ClaimTimeout = 0
			if cfg.Dialect == sqlinbox.SQLite {
				t.Skip("one writer at a time: the write lock serialises whole transactions")
			}
			db := target.open(t)
			cfg.Table = testdb.Table(t, db, "inbox")
			store, err := sqlinbox.New(db, cfg)
			require.NoError(t, err)
			require.NoError(t, store.CreateSchema(ctx))

			const workers, events = 4, 40
			ids := batchIDs(t.Name(), events)
			// The first worker holds its claims until the others queue.
			first, _, err := store.ClaimBatch(ctx, inboxdriver.BatchClaim{Consumer: "c", EventIDs: ids[events/2:]})
			require.NoError(t, err)
			t.Cleanup(func() { _ = first.Rollback(ctx) }) // a no-op after the commit
			var (
				wg   sync.WaitGroup
				mu   sync.Mutex
				wins = map[string]int{}
				errs []error
			)
			for w := range workers {
				batch := make([]string, events)
				for i := range batch { // each worker its own order
					batch[i] = ids[(i*[]int{1, 3, 7, 9}[w]+w)%events]
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					tx, claimed, err := store.ClaimBatch(ctx, inboxdriver.BatchClaim{Consumer: "c", EventIDs: batch})
					if err == nil && tx != nil {
						err = tx.Commit(ctx)
					}
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, err)
						return
					}
					for i, ok := range claimed {
						if ok {
							wins[batch[i]]++
						}
					}
				}()
			}
			waitForWaiters(t, db, cfg.Dialect, cfg.Table, workers)
			require.NoError(t, first.Commit(ctx))
			wg.Wait()
			for _, err := range errs {
				require.False(t, errors.Is(err, inboxdriver.ErrInFlight), "a deadlock: %v", err)
				require.NoError(t, err)
			}
			require.Len(t, wins, events/2)
			for _, id := range ids[:events/2] {
				require.Equal(t, 1, wins[id], id)
			}
		})
	}
}

// waitForWaiters waits until n statements on table wait for a lock: a
// row's or an advisory lock (PostgreSQL); on MySQL, n sessions in a
// statement on table.
func waitForWaiters(t *testing.T, db *sql.DB, dialect sqlinbox.Dialect, table string, n int) {
	t.Helper()
	query, args := `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, []any{table}
	if dialect == sqlinbox.MySQL {
		// A session in a statement on the table waits: for the batches'
		// named lock, or in an INSERT that includes rows the holder has
		// not committed. InnoDB does not always show the INSERT's wait
		// as LOCK WAIT in innodb_trx, so the statements are counted.
		query = `SELECT count(*) FROM information_schema.processlist WHERE command <> 'Sleep' AND id <> CONNECTION_ID() AND LOCATE(?, info) > 0`
	}
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, db.QueryRow(query, args...).Scan(&waiting))
		return waiting >= n
	}, 20*time.Second, 10*time.Millisecond, "waiting for %d claims to wait", n)

}

// A batch claim on a table partitioned by processed_at finds an original
// in an older partition, and one in the default partition, as the single
// claim does.
func TestClaimBatchDuplicateAcrossPartitions(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, store, table := partitionedStore(t, driver, sqlinbox.Daily)
			old := createPartition(t, db, table, 5*24*time.Hour)
			require.True(t, claimOnce(t, store, "billing", "ev-1"))
			_, err := db.Exec(fmt.Sprintf(`UPDATE %s SET processed_at = processed_at - interval '5 days' WHERE event_id = 'ev-1'`, table))
			require.NoError(t, err)
			require.Equal(t, old, partitionOf(t, db, table, "billing", "ev-1"))
			_, err = db.Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at) VALUES ('billing', 'ev-2', now() - interval '40 days')`, table))
			require.NoError(t, err)

			tx, claimed, err := store.ClaimBatch(ctx, inboxdriver.BatchClaim{Consumer: "billing", EventIDs: []string{"ev-3", "ev-2", "ev-1"}})
			require.NoError(t, err)
			require.Equal(t, []bool{true, false, false}, claimed)
			require.NoError(t, tx.Commit(ctx))
			var n int
			require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table).Scan(&n))
			require.Equal(t, 3, n)
		})
	}
}
