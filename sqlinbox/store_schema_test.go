package sqlinbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// CreateSchema calls for two spellings of one table take turns: while one
// holds the schema lock (here stuck behind a table lock, adding the index
// the table lacks), the other waits for that advisory lock rather than
// racing it in the catalog. The stuck one gives up after
// SchemaLockTimeout, with its own error; the other, finding the index
// still missing, does too, and both succeed once the table is free.
func TestSchemaLockIgnoresTableSpelling(t *testing.T) {
	t.Parallel()
	db, first, table := partitionedStore(t, "pgx", sqlinbox.NoPartitioning)
	_, b := spellings(t, db, table)
	second, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: b})
	require.NoError(t, err)
	_, err = db.Exec(`DROP INDEX ` + table + `_processed_at_idx`)
	require.NoError(t, err)

	blocker, err := db.Begin()
	require.NoError(t, err)
	t.Cleanup(func() { _ = blocker.Rollback() })
	_, err = blocker.Exec(`LOCK TABLE ` + table + ` IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	// The schema lock, held here as CreateSchema would: both spellings
	// queue on it.
	holder, err := db.Begin()
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback() })
	var key int64
	require.NoError(t, holder.QueryRow(`SELECT hashtext('watermill_inbox schema ' || current_schema() || '.' || $1)::bigint`, table).Scan(&key))
	_, err = holder.Exec(`SELECT pg_advisory_xact_lock($1::bigint)`, key)
	require.NoError(t, err)
	errs := make(chan error, 2)
	go func() { errs <- first.CreateSchema(context.Background()) }()
	go func() { errs <- second.CreateSchema(context.Background()) }()
	waitFor(t, db, `SELECT count(*) - 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1::bigint`, key)
	require.NoError(t, holder.Rollback())
	for range 2 {
		require.ErrorIs(t, <-errs, sqlinbox.ErrLockTimeout)
	}
	require.NoError(t, blocker.Rollback())
	require.NoError(t, second.CreateSchema(context.Background()))
	require.NoError(t, first.CreateSchema(context.Background()))
	var idx bool
	require.NoError(t, db.QueryRow(`SELECT to_regclass($1) IS NOT NULL`, table+"_processed_at_idx").Scan(&idx))
	require.True(t, idx)
}

// On a table that has everything, CreateSchema takes no table lock: behind
// a transaction holding the table exclusively (as a long handler's claim
// blocks DDL), it succeeds without waiting, where CREATE INDEX IF NOT
// EXISTS would wait (queueing every claim behind it) and time out.
func TestCreateSchemaLeavesACompleteTableAlone(t *testing.T) {
	plainAndDaily(t, func(t *testing.T, mode sqlinbox.Partitioning) {
		db, store, table := partitionedStore(t, "pgx", mode)
		blocker, err := db.Begin()
		require.NoError(t, err)
		t.Cleanup(func() { _ = blocker.Rollback() })
		_, err = blocker.Exec(`LOCK TABLE ` + table + ` IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		require.NoError(t, store.CreateSchema(context.Background()))
	})
}

// plainAndDaily runs fn as a parallel subtest on a plain table and on one
// partitioned daily.
func plainAndDaily(t *testing.T, fn func(t *testing.T, mode sqlinbox.Partitioning)) {
	t.Parallel()
	for _, mode := range []sqlinbox.Partitioning{sqlinbox.NoPartitioning, sqlinbox.Daily} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			fn(t, mode)
		})
	}
}

// waitFor polls query, whose only parameter is arg, until it counts at
// least one row, for up to ten seconds.
func waitFor(t *testing.T, db *sql.DB, query string, arg any) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(query, arg).Scan(&n))
		return n > 0
	}, 10*time.Second, 10*time.Millisecond, "waiting for: %s", query)
}

// A claim never waits behind CreateSchema longer than SchemaLockTimeout:
// with a handler's transaction open on the table (as at every rolling
// deploy), CreateSchema's partition DDL waits for that transaction, and a
// new claim queues behind the DDL; the DDL gives up after
// SchemaLockTimeout, logs that the purge will create the partition, and the
// claim goes through while the handler's transaction is still open.
// Before, CreateSchema waited for the handler to finish, and every claim
// with it.
func TestClaimWaitsOnCreateSchemaAtMostItsLockTimeout(t *testing.T) {
	t.Parallel()
	db, store, table := partitionedStore(t, "pgx", sqlinbox.Daily)
	tomorrow := dropDay(t, db, table, 1)
	handler, deploy, logs := deployBehindAHandler(t, store)
	schemaDone := make(chan error, 1)
	go func() { schemaDone <- deploy.CreateSchema(context.Background()) }()
	waitFor(t, db, `SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND relation = $1::regclass AND mode = 'AccessExclusiveLock' AND NOT granted`, table)

	type result struct {
		waited time.Duration
		err    error
	}
	claimed := make(chan result, 1)
	go func() {
		start := time.Now()
		tx, _, err := claim(context.Background(), store, nil, "billing", "next")
		if err == nil {
			err = tx.Commit()
		}
		claimed <- result{time.Since(start), err}
	}()
	select {
	case r := <-claimed:
		require.NoError(t, r.err)
		t.Logf("the claim waited %s behind CreateSchema (SchemaLockTimeout %s)", r.waited.Round(time.Millisecond), sqlinbox.SchemaLockTimeout)
	case <-time.After(time.Minute):
		t.Fatal("the claim waited for the handler's transaction, behind CreateSchema")
	}
	require.NoError(t, <-schemaDone)
	require.True(t, logs.Has(watermill.CapturedMessage{Level: watermill.InfoLogLevel,
		Msg:    "Inbox partition not created: the table lock was not granted within sqlinbox.SchemaLockTimeout; the purge creates it, and claims go to the default partition meanwhile",
		Fields: watermill.LogFields{"table": table, "partition": tomorrow, "lock_timeout": sqlinbox.SchemaLockTimeout.String()}}))
	require.NoError(t, handler.Commit())
	require.NotContains(t, testdb.TimePartitions(t, db, table), tomorrow)
	require.NoError(t, deploy.CreateSchema(context.Background()))
	require.Contains(t, testdb.TimePartitions(t, db, table), tomorrow)
}

// A period whose rows already went to the default partition cannot get a
// partition of its own. CreateSchema finds it by an index probe and does
// not try, so it takes no table lock for it: with a handler's transaction
// open on the table, it reports the period blocked at once, where trying
// would queue claims behind the table lock until the lock timeout, on
// every call.
func TestCreateSchemaSkipsABlockedPeriodWithoutTheTableLock(t *testing.T) {
	t.Parallel()
	db, store, table := partitionedStore(t, "pgx", sqlinbox.Daily)
	today := dropDay(t, db, table, 0)
	require.True(t, claimOnce(t, store, "billing", "today")) // lands in the default partition
	handler, deploy, logs := deployBehindAHandler(t, store)
	for range 3 {
		require.NoError(t, deploy.CreateSchema(context.Background()))
	}
	blocked := watermill.CapturedMessage{Level: watermill.InfoLogLevel,
		Msg:    "Inbox partition not created: rows of its period are already in the default partition (the purge deletes them there)",
		Fields: watermill.LogFields{"table": table, "partition": today}}
	require.True(t, logs.Has(blocked))
	require.Len(t, logs.Captured()[watermill.InfoLogLevel], 3, "one line per call, and none about a lock not granted")
	require.NoError(t, handler.Commit())
}

// dropDay drops the daily partition of table holding the database's today
// plus days, and returns its name.
func dropDay(t *testing.T, db *sql.DB, table string, days int) string {
	t.Helper()
	var name string
	require.NoError(t, db.QueryRow(`SELECT $1 || '_p' || to_char((now() AT TIME ZONE 'UTC') + $2 * interval '1 day', 'YYYYMMDD')`, table, days).Scan(&name))
	_, err := db.Exec(`DROP TABLE ` + name)
	require.NoError(t, err)
	return name
}

// deployBehindAHandler opens a handler's transaction on store's daily
// partitioned table, as a deploy finds claims in flight, and returns it with
// a store of another instance on the table, logging to logs.
func deployBehindAHandler(t *testing.T, store *sqlinbox.Store) (handler *claimed, deploy *sqlinbox.Store, logs *watermill.CaptureLoggerAdapter) {
	t.Helper()
	handler, ok, err := claim(context.Background(), store, nil, "billing", "in-flight")
	require.NoError(t, err)
	require.True(t, ok)
	t.Cleanup(func() { _ = handler.Rollback() })
	logs = watermill.NewCaptureLogger()
	deploy, err = sqlinbox.New(testdb.Postgres(t, "pgx"), sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: store.Table(), Partitioning: sqlinbox.Daily, Logger: logs})
	require.NoError(t, err)
	return handler, deploy, logs
}
