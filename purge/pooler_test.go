package purge_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// purgeLocks counts the advisory locks held on table's purge key, by any
// session: a lock left behind makes every later round skip.
func purgeLocks(t testing.TB, db *sql.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
AND classid = hashtext('watermill_inbox purge')::oid AND objid = $1::regclass::oid`, table).Scan(&n))
	return n
}

// Through PgBouncer in transaction pooling mode, with other clients keeping
// the pool busy so that a client's consecutive statements reach different
// server connections, rounds of the purge on every store and layout each
// remove what expired, and no purge lock is left behind; two purgers racing
// take turns and remove every row once between them.
func TestPurgeThroughPooler(t *testing.T) {
	t.Parallel()
	testdb.BusyPooler(t, 3)
	pooled := testdb.PgBouncer(t, "pgx")
	testdb.RequireServerSwitches(t, pooled)
	newPgx := func(t *testing.T, c sqlinbox.Config) purge.Store {
		pool, err := pgxpool.New(context.Background(), testdb.PoolerDSN("pgx"))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		store, err := pgxinbox.NewStore(pool, c)
		require.NoError(t, err)
		t.Cleanup(func() { _ = store.Close() })
		return store
	}
	newSQL := func(driver string) func(t *testing.T, c sqlinbox.Config) purge.Store {
		return func(t *testing.T, c sqlinbox.Config) purge.Store {
			store, err := sqlinbox.New(testdb.PgBouncer(t, driver), c)
			require.NoError(t, err)
			return store
		}
	}
	for _, tc := range []struct {
		name  string
		store func(t *testing.T, c sqlinbox.Config) purge.Store
		part  sqlinbox.Partitioning
	}{
		{"lib-pq", newSQL("postgres"), sqlinbox.NoPartitioning},
		{"pgx-stdlib/daily-partitions", newSQL("pgx"), sqlinbox.Daily},
		{"pgx-native", newPgx, sqlinbox.NoPartitioning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, postgres, func(c *sqlinbox.Config) { c.Partitioning = tc.part })
			c := sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: b.table, Partitioning: tc.part, TransactionPooling: true}
			purger := func() *purge.Purger {
				p, err := purge.New(tc.store(t, c), purge.Config{Retention: day, BatchSize: 100, BatchPause: 1})
				require.NoError(t, err)
				return p
			}
			p := purger()
			for round := range 25 {
				b.seed(t, "billing", fmt.Sprintf("r%d-", round), 250, 2*day)
				deleted, err := p.PurgeOnce(context.Background())
				require.NoError(t, err, "round %d", round+1)
				require.EqualValues(t, 250, deleted, "round %d", round+1)
				require.Zero(t, purgeLocks(t, b.db, b.table), "round %d left its lock", round+1)
			}

			b.seed(t, "billing", "race-", 2000, 2*day)
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				total   int64
				skipped int
			)
			for range 2 {
				p := purger()
				wg.Go(func() {
					for range 5 {
						n, err := p.PurgeOnce(context.Background())
						mu.Lock()
						if errors.Is(err, purge.ErrSkipped) {
							skipped++
						} else {
							require.NoError(t, err)
						}
						total += n
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			require.EqualValues(t, 2000, total)
			require.Empty(t, b.rows(t))
			require.Zero(t, purgeLocks(t, b.db, b.table))
			t.Logf("%d of 10 racing rounds skipped", skipped)
		})
	}
}

// A round that finds the lock held says by whom and since when (PostgreSQL
// and MariaDB tell); a round holding the lock that loses it (its
// connection ended) stops instead of running beside the next holder.
func TestSkippedRoundSaysWhoAndHowLong(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		b := setup(t, tg)
		b.seed(t, "billing", "old-", 10, 2*day)
		other, err := sqlinbox.New(tg.open(t), sqlinbox.Config{Dialect: tg.dialect, Table: b.table})
		require.NoError(t, err)
		sess, busy, err := other.Maintenance().BeginPurge(context.Background())
		require.NoError(t, err)
		require.Nil(t, busy)

		_, busy, err = b.store.Maintenance().BeginPurge(context.Background())
		require.NoError(t, err)
		require.NotNil(t, busy)
		require.True(t, busy.Known, "%+v", busy)
		require.GreaterOrEqual(t, busy.HeldFor, 0*day)
		require.Less(t, busy.HeldFor, day)
		require.Regexp(t, `^(PostgreSQL backend|MySQL connection) \d+$`, busy.Holder)
		_, err = b.purger(t, purge.Config{Retention: day}).PurgeOnce(context.Background())
		require.ErrorIs(t, err, purge.ErrSkipped)
		require.ErrorContains(t, err, busy.Holder+" has held the purge lock for ")

		// Ending the holder's session, as an operator would: its round
		// notices at its next batch and stops.
		kill := `SELECT pg_terminate_backend($1)`
		if tg.dialect == sqlinbox.MySQL {
			kill = `KILL ?`
		}
		var id int64
		_, err = fmt.Sscanf(busy.Holder[strings.LastIndex(busy.Holder, " ")+1:], "%d", &id)
		require.NoError(t, err)
		_, err = b.db.Exec(kill, id)
		require.NoError(t, err)
		// The server ends the session a moment later; another round then
		// takes the lock.
		var next maintenance.PurgeSession
		require.Eventually(t, func() bool {
			s, _, err := b.store.Maintenance().BeginPurge(context.Background())
			require.NoError(t, err)
			next = s
			return s != nil
		}, 30*time.Second, 20*time.Millisecond)
		_, err = sess.DeleteBatch(context.Background(), maintenance.PurgeScope{OlderThan: day}, 100, 0)
		require.ErrorContains(t, err, "lost the purge lock")
		_ = sess.Close() // the lock's connection is gone: its release fails, the lock went with it
		require.Equal(t, map[string]int64{"billing": 10}, b.rows(t))
		require.NoError(t, next.Close())

		deleted, err := b.purger(t, purge.Config{Retention: day}).PurgeOnce(context.Background())
		require.NoError(t, err)
		require.EqualValues(t, 10, deleted)
	}, func(tg target) bool { return tg.oneRunner })
}

// A round holds two connections, the lock's and its statements': on a pool
// of one it is refused, saying so, instead of waiting forever for the
// second.
func TestRoundNeedsTwoConnections(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		b := setup(t, tg)
		db := tg.open(t)
		db.SetMaxOpenConns(1)
		store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: tg.dialect, Table: b.table})
		require.NoError(t, err)
		p, err := purge.New(store, purge.Config{Retention: day})
		require.NoError(t, err)
		_, err = p.PurgeOnce(context.Background())
		require.ErrorContains(t, err, "a round holds two connections")
	}, func(tg target) bool { return tg.oneRunner })
}
