package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

var _ purgeDialect = postgresql{}

func (postgresql) purgeQueries(t tableName, c Config) purgeQueries {
	// In partitioned mode whole partitions are dropped; rows are deleted
	// only from the default partition, which catches what no time
	// partition covers, by the partition key's time.
	table, at := t.quoted('"'), "processed_at"
	if c.Partitioning != NoPartitioning {
		table, at = t.derived(defaultPartitionSuffix).quoted('"'), c.PartitionKey.column()
	}
	dollar := func(n int) string { return fmt.Sprintf("$%d", n) }
	// The cutoff is computed from the database clock; now() is the start of
	// the batch's own transaction.
	expired := at + ` < now() - $1::float8 * interval '1 microsecond'`
	return purgeQueries{
		setTimeout: `SELECT set_config('statement_timeout', $1, true)`,
		deleteBatch: func(s scopeShape, _ time.Duration) string {
			// The inner SELECT walks the time's index from the oldest
			// row and stops after $n rows, so each batch costs the same
			// however large the table is; ctid deletes exactly those
			// tuples (a TID scan, no second index lookup).
			return fmt.Sprintf(`DELETE FROM %[1]s WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM %[1]s
	WHERE %[2]s%[3]s
	ORDER BY %[5]s
	LIMIT $%[4]d))`, table, expired, scopeFilter(s, dollar, 2), 2+s.params(), at)
		},
		countExpired: func(s scopeShape) string {
			return fmt.Sprintf(`SELECT consumer, count(*) FROM %s WHERE %s%s GROUP BY consumer`,
				table, expired, scopeFilter(s, dollar, 2))
		},
		// ctid is unique per partition only: a partitioned table purged as
		// a plain one could lose rows of the wrong partition.
		adapt: func(ctx context.Context, conn *sql.Conn, _ *purgeQueries) error {
			return checkLayout(ctx, conn, t, c)
		},
	}
}

// pgTryPurgeLock takes the purge lock of t in the transaction that runs
// it, and returns whether it got it and, when not, how long the holder
// has held it in seconds (NULL when the database does not show that
// session) and the holder's backend pid.
//
// The two-int4 form of advisory locks lives in a lock space of its own,
// apart from the claims' bigint locks; its second key is the table's OID,
// so every spelling of the table name takes the same lock. Releases before
// this one held the same key as a session lock: they and this one exclude
// each other during an upgrade. The holder's xact_start is when its lock
// transaction, hence the lock, began.
func pgTryPurgeLock(t tableName) string {
	return fmt.Sprintf(`WITH k AS (SELECT hashtext('watermill_inbox purge') AS a, '%s'::regclass::oid::int AS b),
l AS (SELECT pg_try_advisory_xact_lock(k.a, k.b) AS got FROM k),
h AS (SELECT h.pid, s.xact_start FROM k, pg_locks h LEFT JOIN pg_stat_activity s ON s.pid = h.pid
	WHERE h.locktype = 'advisory' AND h.granted AND h.objsubid = 2 AND h.classid = k.a::oid AND h.objid = k.b::oid
	AND h.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND h.pid <> pg_backend_pid())
SELECT l.got,
	CASE WHEN l.got THEN NULL ELSE (SELECT extract(epoch FROM now() - min(xact_start))::float8 FROM h) END,
	CASE WHEN l.got THEN NULL ELSE (SELECT min(pid) FROM h) END
FROM l`, t.quoted('"'))
}

// pgPurgeLock is the purge lock of a PostgreSQL table: a
// transaction-scoped advisory lock, taken by a transaction that stays open
// (idle, READ COMMITTED: it holds no snapshot, so it keeps no row from
// vacuum) for the round, on a connection of its own. A session lock would
// outlive a failed unlock and, behind a transaction-pooling proxy, be taken
// on one server connection and released on another, so held for good. A
// transaction ends with its connection, and a proxy ends a server
// connection whose client left in a transaction, so this one cannot leak.
type pgPurgeLock struct{ tx *sql.Tx }

func (postgresql) lockPurge(ctx context.Context, db *sql.DB, t tableName) (purgeLock, *maintenance.Busy, error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, nil, err
	}
	var (
		got     bool
		heldFor sql.NullFloat64
		pid     sql.NullInt64
	)
	if err := tx.QueryRowContext(ctx, pgTryPurgeLock(t)).Scan(&got, &heldFor, &pid); err != nil {
		_ = tx.Rollback()
		return nil, nil, err
	}
	if !got {
		_ = tx.Rollback()
		busy := &maintenance.Busy{Known: heldFor.Valid, HeldFor: time.Duration(heldFor.Float64 * float64(time.Second))}
		if pid.Valid {
			busy.Holder = fmt.Sprintf("PostgreSQL backend %d", pid.Int64)
		}
		return nil, busy, nil
	}
	return pgPurgeLock{tx}, nil, nil
}

// check runs a statement in the lock's transaction: it fails once the
// transaction is gone (its connection lost, idle_in_transaction_session_timeout),
// and keeps an idle timeout from ending it between batches.
func (l pgPurgeLock) check(ctx context.Context, _ *sql.Conn) error {
	_, err := l.tx.ExecContext(ctx, `SELECT 1`)
	return err
}

// release rolls the lock's transaction back. A transaction already ended
// (its context cancelled, which makes [database/sql] roll it back) released
// the lock too.
func (l pgPurgeLock) release() error {
	if err := l.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

func (postgresql) purgeLimits() maintenance.Limits {
	return maintenance.Limits{StatementTimeout: pgMaxTimeout, LockTimeout: pgMaxTimeout}
}

func (postgresql) statementTimedOut(err error) bool {
	return pgCode(err) == "57014" // query_canceled, here by statement_timeout
}
