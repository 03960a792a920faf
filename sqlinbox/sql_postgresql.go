package sqlinbox

// The PostgreSQL SQL that the plain and the partitioned tables,
// [Store.CreateSchema], the purge and Forget share: the claim's insert and its
// lock timeout, the schema and event locks, DDL under a lock timeout, and
// SQLSTATE codes. It uses nothing else of the package but tableName, so every
// PostgreSQL file reads down into it and none back up.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// sqlState is implemented by PostgreSQL driver errors (lib/pq's [*pq.Error] and
// pgx's [*pgconn.PgError]), so errors are recognised by SQLSTATE code without
// importing either driver.
//
// [*pq.Error]: https://pkg.go.dev/github.com/lib/pq#Error
// [*pgconn.PgError]: https://pkg.go.dev/github.com/jackc/pgx/v5/pgconn#PgError
type sqlState interface{ SQLState() string }

func pgCode(err error) string {
	if err == nil {
		// Before errors.As: its target escapes, an allocation that every
		// successful claim would pay.
		return ""
	}
	var e sqlState
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}

// pgMaxTimeout is the longest lock_timeout and statement_timeout
// PostgreSQL takes: an int of milliseconds. A longer one makes every
// statement that sets it fail.
const pgMaxTimeout = math.MaxInt32 * time.Millisecond

// pgInsertClaim is the claim of a table whose key sees every duplicate (a
// plain table, or one partitioned by [EventIDTime]), inserting vals into
// cols, and the statement to run after it. ON CONFLICT DO NOTHING never
// fails on the key: the row count says new (1) or duplicate (0). A copy of
// the event still inside another transaction makes it wait until that one
// commits (duplicate) or rolls back (claimed here).
//
// With a timeout ([Config.ClaimTimeout]), set_config runs in a CTE before
// the insert looks for a conflict, so the lock wait of this very statement
// is bounded; the statement after it restores the session's value, so the
// handler's own statements are not.
//
// processed_at is written as now(), not left to the column's default: a
// default such as now() AT TIME ZONE 'UTC' on a timestamptz is read back in
// the writer's TimeZone, and the purge would delete its rows early.
func pgInsertClaim(timeout time.Duration, table, cols, vals string) (claim, after string) {
	cols, vals = cols+", processed_at", vals+", now()"
	if timeout > 0 {
		return fmt.Sprintf(`%sINSERT INTO %s (%s) SELECT %s FROM lt ON CONFLICT DO NOTHING`, pgClaimTimeout(timeout), table, cols, vals), pgRestoreLockTimeout
	}
	return fmt.Sprintf(`INSERT INTO %s (%s) VALUES (%s) ON CONFLICT DO NOTHING`, table, cols, vals), ""
}

// pgClaimTimeout is a WITH clause whose CTE lt, selected from, sets
// lock_timeout to timeout ([Config.ClaimTimeout]) for the rest of the
// transaction. It first keeps the value it replaces in a setting of the
// transaction, watermill_inbox.lock_timeout (lt reads prev, so prev runs
// first), for pgRestoreLockTimeout: SET LOCAL ... TO DEFAULT would restore
// the role's or database's default, not a value the application SET on
// its connections. Kept on the server, the value costs the pipelined claim
// no round trip.
func pgClaimTimeout(timeout time.Duration) string {
	return fmt.Sprintf(`WITH prev AS (SELECT set_config('watermill_inbox.lock_timeout', current_setting('lock_timeout'), true)),
lt AS (SELECT set_config('lock_timeout', '%dms', true) FROM prev)
`, max(timeout.Milliseconds(), 1))
}

// pgRestoreLockTimeout gives the handler the lock_timeout the session had
// before pgClaimTimeout.
const pgRestoreLockTimeout = `SELECT set_config('lock_timeout', current_setting('watermill_inbox.lock_timeout'), true)`

// pgSchemaLock serialises concurrent [Store.CreateSchema] calls: concurrent
// CREATE TABLE IF NOT EXISTS can still collide in the catalog (unique violation
// on pg_type), so instances starting together take turns on a
// transaction-scoped advisory lock. The table may not exist yet, so the key is
// its schema-qualified name, an unqualified one completed with the schema
// CREATE TABLE uses: "inbox" and "public.inbox" share the lock.
func pgSchemaLock(t tableName) string {
	schema := "COALESCE(current_schema(), '')"
	if t.schema != "" {
		schema = "'" + t.schema + "'"
	}
	return fmt.Sprintf(`SELECT pg_advisory_xact_lock(hashtext('watermill_inbox schema ' || %s || '.%s'))`, schema, t.name)
}

// pgCreateTable is the inbox table's DDL, plain or partitioned: key lists
// the primary key columns and suffix follows the column list.
func pgCreateTable(table, idType, fpCol, key, suffix string) string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer     text        NOT NULL CHECK (octet_length(consumer) BETWEEN 1 AND 255),
	event_id     %-11s NOT NULL,
	processed_at timestamptz NOT NULL DEFAULT now(),%s
	PRIMARY KEY (%s)
)%s`, table, idType, fpCol, key, suffix)
}

// pgEventLock is the transaction-scoped advisory lock on one event's key
// in a partitioned table, consumer and eventID being SQL text expressions.
// The claim takes it, and so does whatever removes a claim while claims
// run (Forget): both must compute the very same key.
func pgEventLock(t tableName, consumer, eventID string) string {
	return fmt.Sprintf(`pg_advisory_xact_lock(hashtextextended('%s'::regclass::oid::text || ':' || length(%s) || ':' || %s || %s, 0))`,
		t.quoted('"'), consumer, consumer, eventID)
}

// rowQuerier is a [*sql.DB] or a [*sql.Conn].
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// queryer is a [*sql.DB] or a [*sql.Conn].
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// conner is a [*sql.DB] or a [*sql.Conn].
type conner interface {
	queryer
	rowQuerier
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// pgDDL runs one DDL statement on table t in a transaction of its own: the
// schema lock first, without a timeout (its holders wait at most
// lockTimeout for their own table locks), then at most lockTimeout for the
// statement's table locks, claims queueing behind that wait. A lock
// timeout wraps [maintenance.ErrLockTimeout].
func pgDDL(ctx context.Context, db conner, t tableName, stmt string, lockTimeout time.Duration) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	if _, err := tx.ExecContext(ctx, pgSchemaLock(t)); err != nil {
		return err
	}
	if err := pgSetLockTimeout(ctx, tx, lockTimeout); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, stmt); err != nil {
		return pgDDLErr(err)
	}
	return tx.Commit()
}

// pgSetLockTimeout sets lock_timeout for the rest of tx (0: none).
func pgSetLockTimeout(ctx context.Context, tx *sql.Tx, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	_, err := tx.ExecContext(ctx, `SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(max(d.Milliseconds(), 1), 10))
	return err
}

// pgDDLErr marks a DDL statement's lock timeout: the table lock, not an
// event in flight (which is what classify makes of a claim's).
func pgDDLErr(err error) error {
	if pgCode(err) == "55P03" {
		return fmt.Errorf("%w: %w", maintenance.ErrLockTimeout, err)
	}
	return err
}

// pgNow returns the database clock minus ago, in UTC. It is read as text
// the query formats (pgUTC), not scanned as a timestamptz: lib/pq reads
// results as text, which the session's DateStyle spells ("02/12/2026
// 20:50:58.2 +14" with SQL, DMY) and lib/pq cannot parse.
func pgNow(ctx context.Context, db rowQuerier, ago time.Duration) (time.Time, error) {
	var text string
	if err := db.QueryRowContext(ctx, `SELECT `+pgUTC(`now() - $1::float8 * interval '1 microsecond'`), ago.Microseconds()).Scan(&text); err != nil {
		return time.Time{}, err
	}
	return parseTime(text)
}
