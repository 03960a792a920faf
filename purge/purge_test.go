package purge_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// target is one database the purge runs on.
type target struct {
	name    string
	dialect sqlinbox.Dialect
	open    func(t testing.TB) *sql.DB
	// seed inserts n rows for consumer, with event ids prefix1..prefixN,
	// processed age ago by the database clock, as if claimed then.
	seed func(t testing.TB, db *sql.DB, table, consumer, prefix string, n int, age time.Duration)
	// holdRow locks one row of table in an open transaction, so that a
	// DELETE reaching it waits; it returns the rollback.
	holdRow func(t testing.TB, db *sql.DB, table, consumer, eventID string) func()
	// oneRunner: the database offers a lock that keeps a second instance's
	// purge from running concurrently (SQLite serialises writers itself).
	oneRunner bool
}

func targets() []target {
	return []target{
		{name: "PostgreSQL", dialect: sqlinbox.PostgreSQL, open: func(t testing.TB) *sql.DB { return testdb.Postgres(t, "pgx") }, seed: seedPostgres, holdRow: holdRowPostgres, oneRunner: true},
		{name: "MySQL", dialect: sqlinbox.MySQL, open: testdb.MySQL, seed: seedMySQL, holdRow: holdRowMySQL, oneRunner: true},
		{name: "SQLite", dialect: sqlinbox.SQLite, open: testdb.SQLite, seed: seedSQLite},
	}
}

// seedValues inserts n rows in chunks of multi-row VALUES, each row
// rendered by row with three placeholders (consumer, event id, age).
func seedValues(t testing.TB, db *sql.DB, table, row, consumer, prefix string, n int, age any) {
	t.Helper()
	for start := 0; start < n; start += 500 {
		var values []string
		var args []any
		for i := start; i < min(start+500, n); i++ {
			values = append(values, row)
			args = append(args, consumer, fmt.Sprintf("%s%d", prefix, i+1), age)
		}
		_, err := db.Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at) VALUES %s`, table, strings.Join(values, ", ")), args...)
		require.NoError(t, err)
	}
}

func seedMySQL(t testing.TB, db *sql.DB, table, consumer, prefix string, n int, age time.Duration) {
	seedValues(t, db, table, "(?, ?, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)", consumer, prefix, n, age.Microseconds())
}

func seedSQLite(t testing.TB, db *sql.DB, table, consumer, prefix string, n int, age time.Duration) {
	seedValues(t, db, table, "(?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?))", consumer, prefix, n, fmt.Sprintf("-%f seconds", age.Seconds()))
}

func holdRowMySQL(t testing.TB, db *sql.DB, table, consumer, eventID string) func() {
	t.Helper()
	tx, err := db.Begin()
	require.NoError(t, err)
	var got string
	require.NoError(t, tx.QueryRow(fmt.Sprintf(`SELECT event_id FROM %s WHERE consumer = ? AND event_id = ? FOR UPDATE`, table), consumer, eventID).Scan(&got))
	return func() { _ = tx.Rollback() }
}

func seedPostgres(t testing.TB, db *sql.DB, table, consumer, prefix string, n int, age time.Duration) {
	t.Helper()
	_, err := db.Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at)
SELECT $1, $2 || g, now() - $3::float8 * interval '1 microsecond' FROM generate_series(1, $4::int) g`, table),
		consumer, prefix, age.Microseconds(), n)
	require.NoError(t, err)
}

func holdRowPostgres(t testing.TB, db *sql.DB, table, consumer, eventID string) func() {
	t.Helper()
	tx, err := db.Begin()
	require.NoError(t, err)
	var got string
	require.NoError(t, tx.QueryRow(fmt.Sprintf(`SELECT event_id FROM %s WHERE consumer = $1 AND event_id = $2 FOR UPDATE`, table), consumer, eventID).Scan(&got))
	return func() { _ = tx.Rollback() }
}

// forEach runs fn as a parallel subtest per target, or per target that
// keep accepts.
func forEach(t *testing.T, fn func(t *testing.T, tg target), keep ...func(target) bool) {
	t.Parallel()
	for _, tg := range targets() {
		if len(keep) > 0 && !keep[0](tg) {
			continue
		}
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			fn(t, tg)
		})
	}
}

type bundle struct {
	tg    target
	db    *sql.DB
	store *sqlinbox.Store
	table string
}

func setup(t testing.TB, tg target, mutate ...func(*sqlinbox.Config)) *bundle {
	t.Helper()
	db := tg.open(t)
	cfg := sqlinbox.Config{Dialect: tg.dialect, Table: testdb.Table(t, db, "purge")}
	for _, m := range mutate {
		m(&cfg)
	}
	store, err := sqlinbox.New(db, cfg)
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	t.Cleanup(func() { _ = store.Close() })
	return &bundle{tg: tg, db: db, store: store, table: cfg.Table}
}

func (b *bundle) seed(t testing.TB, consumer, prefix string, n int, age time.Duration) {
	b.tg.seed(t, b.db, b.table, consumer, prefix, n, age)
}

// rows returns the table's row count per consumer.
func (b *bundle) rows(t testing.TB) map[string]int64 {
	t.Helper()
	rows, err := b.db.Query(fmt.Sprintf(`SELECT consumer, COUNT(*) FROM %s GROUP BY consumer`, b.table))
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var c string
		var n int64
		require.NoError(t, rows.Scan(&c, &n))
		out[c] = n
	}
	require.NoError(t, rows.Err())
	return out
}

func (b *bundle) has(t testing.TB, consumer, eventID string) bool {
	t.Helper()
	var n int
	ph := "$1"
	ph2 := "$2"
	if b.tg.dialect != sqlinbox.PostgreSQL {
		ph, ph2 = "?", "?"
	}
	require.NoError(t, b.db.QueryRow(fmt.Sprintf(`SELECT COUNT(*) FROM %s WHERE consumer = %s AND event_id = %s`, b.table, ph, ph2), consumer, eventID).Scan(&n))
	return n == 1
}

func (b *bundle) purger(t testing.TB, cfg purge.Config) *purge.Purger {
	t.Helper()
	if cfg.BatchPause == 0 {
		cfg.BatchPause = time.Millisecond
	}
	p, err := purge.New(b.store, cfg)
	require.NoError(t, err)
	return p
}

// claim delivers (consumer, id) to the store and commits: true when it was
// new.
func (b *bundle) claim(t testing.TB, consumer, id string) bool {
	t.Helper()
	tx, ok, err := claim(context.Background(), b.store, nil, consumer, id)
	require.NoError(t, err)
	if ok {
		require.NoError(t, tx.Commit())
	}
	return ok
}

const day = 24 * time.Hour

func TestConfig(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", testdb.PostgresDSN()) // not reached: New does not touch the database
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL})
	require.NoError(t, err)
	partitioned, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Daily})
	require.NoError(t, err)

	for _, tc := range []struct {
		name  string
		store *sqlinbox.Store
		cfg   purge.Config
		err   string
	}{
		{"retention required", store, purge.Config{}, "Retention is required"},
		{"negative retention", store, purge.Config{Retention: -day}, "Retention must be positive"},
		{"below the floor", store, purge.Config{Retention: time.Hour}, "Retention 1h0m0s is below MinRetention 24h0m0s"},
		{"below a raised floor", store, purge.Config{Retention: 2 * day, MinRetention: 7 * day}, "below MinRetention"},
		{"override below the floor", store, purge.Config{Retention: 14 * day, ConsumerRetention: map[string]time.Duration{"mailer": time.Hour}}, `ConsumerRetention["mailer"] 1h0m0s is below MinRetention`},
		{"zero override", store, purge.Config{Retention: 14 * day, ConsumerRetention: map[string]time.Duration{"mailer": 0}, AllowShortRetention: true}, `ConsumerRetention["mailer"] must be positive`},
		{"empty consumer", store, purge.Config{Retention: 14 * day, ConsumerRetention: map[string]time.Duration{"": 20 * day}}, "empty consumer name"},
		{"tiny batch", store, purge.Config{Retention: 14 * day, BatchSize: 10}, "BatchSize 10 is below MinBatchSize"},
		{"huge batch", store, purge.Config{Retention: 14 * day, BatchSize: purge.MaxBatchSize + 1}, "BatchSize 50001 is above MaxBatchSize (50000)"},
		{"largest batch", store, purge.Config{Retention: 14 * day, BatchSize: purge.MaxBatchSize}, ""},
		{"negative timeout", store, purge.Config{Retention: 14 * day, StatementTimeout: -time.Second}, "StatementTimeout is negative"},
		{"overrides on partitions", partitioned, purge.Config{Retention: 14 * day, ConsumerRetention: map[string]time.Duration{"mailer": 30 * day}}, "not available on a partitioned table"},
		{"ok", store, purge.Config{Retention: 14 * day}, ""},
		{"short allowed", store, purge.Config{Retention: time.Minute, AllowShortRetention: true}, ""},
		{"floor lowered", store, purge.Config{Retention: time.Hour, MinRetention: time.Hour}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := purge.New(tc.store, tc.cfg)
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, "purge: invalid config: ")
			require.ErrorContains(t, err, tc.err)
		})
	}
	_, err = purge.New(nil, purge.Config{Retention: 14 * day})
	require.ErrorContains(t, err, "store is nil")
	_, err = purge.New((*sqlinbox.Store)(nil), purge.Config{Retention: 14 * day})
	require.ErrorContains(t, err, "store is nil")
}

// purge.New takes the native pgx store as it takes the database/sql one.
func TestPgxStore(t *testing.T) {
	t.Parallel()
	b := setup(t, postgres)
	b.seed(t, "billing", "old-", 120, 2*day)
	b.seed(t, "billing", "young-", 3, time.Hour)
	pool, err := pgxpool.New(context.Background(), testdb.PostgresDSN())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{Table: b.table})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	p, err := purge.New(store, purge.Config{Retention: day, BatchSize: purge.MinBatchSize, BatchPause: time.Millisecond})
	require.NoError(t, err)
	deleted, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 120, deleted)
	require.Equal(t, map[string]int64{"billing": 3}, b.rows(t))
}

// ErrSkipped is matched with errors.Is, and by its Skipped method where
// package purge is not imported (prommetrics).
func TestErrSkipped(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("round: %w", purge.ErrSkipped)
	require.ErrorIs(t, err, purge.ErrSkipped)
	var s interface{ Skipped() bool }
	require.ErrorAs(t, err, &s)
	require.True(t, s.Skipped())
	require.NotErrorIs(t, errors.New(purge.ErrSkipped.Error()), purge.ErrSkipped)
}

// Exactly the expired rows go, in several batches; the young ones stay.
func TestDeletesOnlyExpiredRows(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		b := setup(t, tg)
		b.seed(t, "billing", "old-", 2345, 3*day)
		b.seed(t, "billing", "edge-", 10, day+time.Minute)
		b.seed(t, "billing", "young-", 300, day-time.Minute)
		b.seed(t, "mailer", "old-", 50, 30*day)
		b.seed(t, "mailer", "young-", 7, time.Hour)

		var batches []int64 // OnBatch runs on the round's goroutine
		p := b.purger(t, purge.Config{Retention: day, BatchSize: 500, OnBatch: func(n int64) { batches = append(batches, n) }})
		deleted, err := p.PurgeOnce(context.Background())
		require.NoError(t, err)
		require.EqualValues(t, 2345+10+50, deleted)
		// Full batches, then the short one that ends the round.
		require.Equal(t, []int64{500, 500, 500, 500, 405}, batches)
		require.Equal(t, map[string]int64{"billing": 300, "mailer": 7}, b.rows(t))
		require.True(t, b.has(t, "billing", "young-1"))
		require.False(t, b.has(t, "billing", "edge-1"))

		deleted, err = p.PurgeOnce(context.Background())
		require.NoError(t, err)
		require.Zero(t, deleted)
		require.Equal(t, map[string]int64{"billing": 300, "mailer": 7}, b.rows(t))
	})
}

// After a purge, an event claimed recently is still a duplicate; only an
// event older than the retention can be processed again.
func TestRecentDuplicatesStayBlocked(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		b := setup(t, tg)
		require.True(t, b.claim(t, "billing", "recent"))
		b.seed(t, "billing", "old-", 1000, 2*day)

		p := b.purger(t, purge.Config{Retention: day, BatchSize: 300})
		deleted, err := p.PurgeOnce(context.Background())
		require.NoError(t, err)
		require.EqualValues(t, 1000, deleted)

		require.False(t, b.claim(t, "billing", "recent"), "a recent event must stay a duplicate")
		require.True(t, b.claim(t, "billing", "old-1"), "a purged event is new again")
		require.Equal(t, map[string]int64{"billing": 2}, b.rows(t))
	})
}

// Per-consumer retention: listed consumers keep their own, the others the
// default.
func TestConsumerRetention(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		b := setup(t, tg)
		b.seed(t, "billing", "d2-", 100, 2*day)
		b.seed(t, "audit", "d2-", 100, 2*day)
		b.seed(t, "audit", "d9-", 100, 9*day)
		b.seed(t, "mailer", "d2-", 100, 2*day)
		b.seed(t, "mailer", "h3-", 100, 3*time.Hour)

		p := b.purger(t, purge.Config{
			Retention:           day,
			ConsumerRetention:   map[string]time.Duration{"audit": 7 * day, "mailer": 2 * time.Hour},
			AllowShortRetention: true,
			BatchSize:           purge.MinBatchSize,
		})
		counts, err := p.DryRun(context.Background())
		require.NoError(t, err)
		require.Equal(t, map[string]int64{"billing": 100, "audit": 100, "mailer": 200}, counts)
		require.Len(t, b.rows(t), 3, "a dry run deletes nothing")

		deleted, err := p.PurgeOnce(context.Background())
		require.NoError(t, err)
		require.EqualValues(t, 400, deleted)
		require.Equal(t, map[string]int64{"audit": 100}, b.rows(t))
		require.True(t, b.has(t, "audit", "d2-1"))
	})
}

// While one purge holds the table's lock, another instance skips its round
// instead of waiting; concurrent purgers remove every row exactly once
// between them.
func TestOneRunnerAtATime(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		b := setup(t, tg)
		b.seed(t, "billing", "old-", 3000, 2*day)
		ctx := context.Background()
		if !tg.oneRunner {
			// SQLite serialises the rounds' writes: four at once delete
			// each row once. A round that waited for the write lock longer
			// than the busy timeout, which a busy machine can make it do,
			// gives up with a batch timeout, having counted what it
			// deleted; one more round, alone, deletes the rest.
			var (
				wg    sync.WaitGroup
				total atomic.Int64
			)
			for range 4 {
				p := b.purger(t, purge.Config{Retention: day, BatchSize: 200, BatchPause: 5 * time.Millisecond})
				wg.Go(func() {
					n, err := p.PurgeOnce(ctx)
					if err != nil {
						assert.ErrorIs(t, err, maintenance.ErrPurgeTimeout)
					}
					total.Add(n)
				})
			}
			wg.Wait()
			n, err := b.purger(t, purge.Config{Retention: day}).PurgeOnce(ctx)
			require.NoError(t, err)
			require.EqualValues(t, 3000, total.Load()+n)
			require.Empty(t, b.rows(t))
			return
		}

		// Another instance: its own pool, so its own database session.
		other, err := sqlinbox.New(tg.open(t), sqlinbox.Config{Dialect: tg.dialect, Table: b.table})
		require.NoError(t, err)
		sess, busy, err := other.Maintenance().BeginPurge(ctx)
		require.NoError(t, err)
		require.Nil(t, busy)
		p := b.purger(t, purge.Config{Retention: day})
		deleted, err := p.PurgeOnce(ctx)
		require.ErrorIs(t, err, purge.ErrSkipped)
		require.Zero(t, deleted)
		_, err = p.DryRun(ctx)
		require.ErrorIs(t, err, purge.ErrSkipped)
		require.Equal(t, map[string]int64{"billing": 3000}, b.rows(t))
		require.NoError(t, sess.Close())

		// A round holds the lock from its start to its end, and cannot end
		// while a row it must delete is locked: once its DELETE waits for
		// that row, the three rounds started then skip rather than queue.
		release := tg.holdRow(t, b.db, b.table, "billing", "old-1")
		first := b.purger(t, purge.Config{Retention: day, BatchSize: 200, StatementTimeout: 2 * time.Minute})
		type result struct {
			n   int64
			err error
		}
		done := make(chan result, 1)
		go func() {
			n, err := first.PurgeOnce(ctx)
			done <- result{n, err}
		}()
		require.Eventually(t, func() bool { return deleteRunning(t, b) }, time.Minute, 10*time.Millisecond, "the first round's DELETE never started")
		var wg sync.WaitGroup
		for range 3 {
			p := b.purger(t, purge.Config{Retention: day, BatchSize: 200})
			wg.Go(func() {
				n, err := p.PurgeOnce(ctx)
				assert.ErrorIs(t, err, purge.ErrSkipped)
				assert.Zero(t, n)
			})
		}
		wg.Wait()
		release()
		r := <-done
		require.NoError(t, r.err)
		require.EqualValues(t, 3000, r.n)
		require.Empty(t, b.rows(t))
	})
}

// deleteRunning reports whether a purge's DELETE on b's table runs on the
// server, waiting for a lock or not.
func deleteRunning(t *testing.T, b *bundle) bool {
	t.Helper()
	query := `SELECT count(*) FROM pg_stat_activity WHERE strpos(query, 'DELETE FROM') > 0 AND strpos(query, $1) > 0 AND state = 'active' AND pid <> pg_backend_pid()`
	if b.tg.dialect == sqlinbox.MySQL {
		query = `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE LOCATE('DELETE /*', INFO) > 0 AND LOCATE(?, INFO) > 0 AND ID <> CONNECTION_ID()`
	}
	var n int
	require.NoError(t, b.db.QueryRow(query, b.table).Scan(&n))
	return n > 0
}

// A DELETE that runs into its statement timeout is retried with half the
// batch; when even the smallest batch times out the round fails, deleting
// nothing of the blocked batch. Once the blocker is gone the purge finishes.
func TestTimeoutShrinksTheBatch(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		b := setup(t, tg)
		b.seed(t, "billing", "old-", 1000, 2*day)
		release := tg.holdRow(t, b.db, b.table, "billing", "old-1")
		p := b.purger(t, purge.Config{Retention: day, BatchSize: 4 * purge.MinBatchSize, StatementTimeout: 100 * time.Millisecond})
		deleted, err := p.PurgeOnce(context.Background())
		require.ErrorIs(t, err, maintenance.ErrPurgeTimeout)
		require.ErrorContains(t, err, fmt.Sprintf("a batch of %d rows still timed out", purge.MinBatchSize))
		require.Zero(t, deleted)
		require.Equal(t, map[string]int64{"billing": 1000}, b.rows(t))

		release()
		deleted, err = p.PurgeOnce(context.Background())
		require.NoError(t, err)
		require.EqualValues(t, 1000, deleted)
		require.Empty(t, b.rows(t))
	}, func(tg target) bool { return tg.holdRow != nil }) // SQLite locks the whole database, not a row
}

// A timeout below the database's unit still bounds the batch: MariaDB's
// max_statement_time in milliseconds would read 100µs as 0, no limit, and
// the batch would wait out innodb_lock_wait_timeout (50 s by default).
func TestSubMillisecondTimeoutStillBounds(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		b := setup(t, tg)
		b.seed(t, "billing", "old-", 10, 2*day)
		release := tg.holdRow(t, b.db, b.table, "billing", "old-1")
		defer release()
		p := b.purger(t, purge.Config{Retention: day, BatchSize: purge.MinBatchSize, StatementTimeout: 100 * time.Microsecond})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := p.PurgeOnce(ctx)
		require.ErrorIs(t, err, maintenance.ErrPurgeTimeout)
	}, func(tg target) bool { return tg.holdRow != nil })
}

// Run purges at once, then every Interval, and returns nil when its context
// ends.
func TestRun(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		b := setup(t, tg)
		b.seed(t, "billing", "old-", 500, 2*day)
		var (
			mu     sync.Mutex
			rounds []int64
		)
		p := b.purger(t, purge.Config{Retention: day, Interval: 50 * time.Millisecond, OnRound: func(n int64, _ time.Duration, err error) {
			if errors.Is(err, context.Canceled) {
				return // the round the test's end interrupted
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				n = -1
			}
			rounds = append(rounds, n)
		}})
		// Rounds that removed rows; waiting for them rather than for an
		// empty table, which the test can see while the round's COMMIT
		// reply is still on its way: cancelling then fails that round.
		removed := func() []int64 {
			mu.Lock()
			defer mu.Unlock()
			return slices.DeleteFunc(slices.Clone(rounds), func(n int64) bool { return n == 0 })
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		require.Eventually(t, func() bool { return len(removed()) == 1 }, 10*time.Second, 20*time.Millisecond)
		b.seed(t, "billing", "later-", 100, 3*day)
		require.Eventually(t, func() bool { return len(removed()) == 2 }, 10*time.Second, 20*time.Millisecond)
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
		require.Equal(t, []int64{500, 100}, removed())
		require.Empty(t, b.rows(t))
	})
}

// A StatementTimeout or LockTimeout the database's setting cannot take
// would fail every batch or partition change: New refuses it, naming the
// field and the limit. At the limit a round runs (partitions included on
// PostgreSQL, a strict sql_mode on MariaDB); SQLite uses neither timeout,
// so it takes any.
func TestTimeoutLimits(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		var statement, lock time.Duration
		mutate := func(*sqlinbox.Config) {}
		switch tg.dialect {
		case sqlinbox.PostgreSQL:
			statement, lock = 2147483647*time.Millisecond, 2147483647*time.Millisecond
			mutate = func(c *sqlinbox.Config) { c.Partitioning = sqlinbox.Daily }
		case sqlinbox.MySQL:
			statement = 31_536_000 * time.Second
			cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
			require.NoError(t, err)
			cfg.Params = map[string]string{"sql_mode": "'TRADITIONAL'"}
			tg.open = func(t testing.TB) *sql.DB { return testdb.Open(t, "mysql", cfg.FormatDSN()) }
		}
		b := setup(t, tg, mutate)
		// Two days old: no partition covers them, the default partition
		// does, and the purge deletes them there.
		b.seed(t, "billing", "old-", 10, 2*day)
		const max = time.Duration(1<<63 - 1)
		for _, tc := range []struct {
			field string
			limit time.Duration
			set   func(c *purge.Config, d time.Duration)
		}{
			{"StatementTimeout", statement, func(c *purge.Config, d time.Duration) { c.StatementTimeout = d }},
			{"LockTimeout", lock, func(c *purge.Config, d time.Duration) { c.LockTimeout = d }},
		} {
			cfg := purge.Config{Retention: time.Hour, AllowShortRetention: true}
			if tc.limit == 0 {
				tc.set(&cfg, max)
				_, err := purge.New(b.store, cfg)
				require.NoError(t, err, "%s is not used on %s", tc.field, tg.name)
				continue
			}
			tc.set(&cfg, tc.limit+time.Millisecond)
			_, err := purge.New(b.store, cfg)
			require.ErrorContains(t, err, fmt.Sprintf("%s %s is above %s, the longest the %s database takes", tc.field, tc.limit+time.Millisecond, tc.limit, tg.dialect))
		}
		p := b.purger(t, purge.Config{Retention: time.Hour, AllowShortRetention: true, StatementTimeout: or(statement, max), LockTimeout: or(lock, max)})
		n, err := p.PurgeOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, int64(10), n)
	})
}

// or returns d, or otherwise when d is zero.
func or(d, otherwise time.Duration) time.Duration {
	if d == 0 {
		return otherwise
	}
	return d
}

// claim claims (consumer, eventID) through store as the middleware does
// and returns the claim's transaction, nil for a duplicate.
func claim(ctx context.Context, store inboxdriver.Store, opts *sql.TxOptions, consumer, eventID string) (*claimed, bool, error) {
	tx, _, err := store.Claim(ctx, inboxdriver.Claim{TxOptions: opts, Consumer: consumer, EventID: eventID})
	if tx == nil {
		return nil, false, err
	}
	return &claimed{Tx: tx.Handle().(*sql.Tx), claim: tx}, true, err
}

// claimed is a claim's *sql.Tx that ends through the store's transaction,
// which gives the claim's place in the pool back.
type claimed struct {
	*sql.Tx
	claim inboxdriver.Tx
}

func (c *claimed) Commit() error   { return c.claim.Commit(context.Background()) }
func (c *claimed) Rollback() error { return c.claim.Rollback(context.Background()) }

// A batch is DefaultBatchSize rows, DefaultSQLiteBatchSize on SQLite,
// where every claim waits behind it.
func TestDefaultBatchSize(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		b := setup(t, tg)
		b.seed(t, "billing", "old-", purge.DefaultSQLiteBatchSize+1, 2*day)
		var batches []int64
		p := b.purger(t, purge.Config{Retention: day, OnBatch: func(n int64) { batches = append(batches, n) }})
		_, err := p.PurgeOnce(context.Background())
		require.NoError(t, err)
		want := []int64{purge.DefaultSQLiteBatchSize + 1}
		if tg.dialect == sqlinbox.SQLite {
			want = []int64{purge.DefaultSQLiteBatchSize, 1}
		}
		require.Equal(t, want, batches)
	})
}

// On SQLite each batch waits for the write lock by polling rather than
// through the busy handler, and gives its connection back to the pool with
// the busy timeout it had: claims on it must still wait for the lock.
func TestSQLiteBatchKeepsTheBusyTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, sqliteTarget)
	b.db.SetMaxOpenConns(1) // the purge's connection is the claims' next one
	b.seed(t, "billing", "old-", 10, 2*day)
	n, err := b.purger(t, purge.Config{Retention: day}).PurgeOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 10, n)
	var ms int64
	require.NoError(t, b.db.QueryRow(`PRAGMA busy_timeout`).Scan(&ms))
	require.Equal(t, sqlinbox.DefaultSQLiteBusyTimeout.Milliseconds(), ms)
}
