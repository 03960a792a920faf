package sqlinbox

import (
	"errors"
	"fmt"
	"time"

	inbox "github.com/watermill-inbox/inbox"
)

// PostgreSQL is the dialect for PostgreSQL 12 and later, through lib/pq or
// pgx's stdlib.
var PostgreSQL Dialect = postgresql{}

type postgresql struct{}

func (postgresql) String() string { return "postgresql" }

func (postgresql) queries(t tableName, c Config) queries {
	table := t.quoted('"')
	idType := "text"
	if c.UUIDEventIDs {
		idType = "uuid"
	}
	// With fingerprints the claim inserts a third column.
	cols, fpCol, fpVal := "consumer, event_id", "", ""
	if c.Fingerprints {
		cols, fpCol, fpVal = "consumer, event_id, fingerprint", "\n\tfingerprint  bytea,", ", $3::bytea"
	}
	// On a partitioned table min() reads each partition's index.
	oldest := fmt.Sprintf(`SELECT %s FROM %s`, pgUTC("min(processed_at)"), table)
	if c.Partitioning != NoPartitioning && c.PartitionKey == EventIDTime {
		return idTimeQueries(t, c, idType, fpCol)
	}
	if c.Partitioning != NoPartitioning {
		q := partitionedQueries(t, c, idType, cols, fpCol, fpVal)
		q.addFingerprint = fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS fingerprint bytea`, table)
		q.oldest = oldest
		return q
	}
	q := queries{
		schema: []string{
			pgCreateTable(table, idType, fpCol, "consumer, event_id", ""),
			// The purge deletes by age; without this index each batch would
			// scan the table.
			fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (processed_at)`, quoteName(t.derived("processed_at_idx").name, '"'), table),
		},
		schemaObjects: []tableName{t, t.derived("processed_at_idx")},
	}
	q.claim, q.afterClaim = pgInsertClaim(c, table, cols, "$1::text, $2::"+idType+fpVal)
	if c.Fingerprints {
		q.fingerprint = fmt.Sprintf(`SELECT fingerprint FROM %s WHERE consumer = $1 AND event_id = $2`, table)
	}
	// A nullable column without a default: a catalog change, no rewrite.
	q.addFingerprint = fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS fingerprint bytea`, table)
	q.oldest = oldest
	q.verify = verifyLayout(t, c)
	return q
}

// pgInsertClaim is the claim of a table whose key sees every duplicate (a
// plain table, or one partitioned by EventIDTime), inserting vals into
// cols, and the statement to run after it. ON CONFLICT DO NOTHING never
// fails on the key: the row count says new (1) or duplicate (0). A copy of
// the event still inside another transaction makes it wait until that one
// commits (duplicate) or rolls back (claimed here).
//
// With a ClaimTimeout, set_config runs in a CTE before the insert looks for
// a conflict, so the lock wait of this very statement is bounded; the
// statement after it restores the session's value, so the handler's own
// statements are not.
func pgInsertClaim(c Config, table, cols, vals string) (claim, after string) {
	if c.ClaimTimeout > 0 {
		return fmt.Sprintf(`%sINSERT INTO %s (%s) SELECT %s FROM lt ON CONFLICT DO NOTHING`, pgClaimTimeout(c), table, cols, vals), pgRestoreLockTimeout
	}
	return fmt.Sprintf(`INSERT INTO %s (%s) VALUES (%s) ON CONFLICT DO NOTHING`, table, cols, vals), ""
}

// pgClaimTimeout is a WITH clause whose CTE lt, selected from, sets
// lock_timeout to Config.ClaimTimeout for the rest of the transaction. It
// first keeps the value it replaces in a setting of the transaction,
// watermill_inbox.lock_timeout (lt reads prev, so prev runs first), for
// pgRestoreLockTimeout: SET LOCAL ... TO DEFAULT would restore the role's
// or database's default, not a value the application SET on its
// connections. Kept on the server, the value costs the pipelined claim no
// round trip.
func pgClaimTimeout(c Config) string {
	return fmt.Sprintf(`WITH prev AS (SELECT set_config('watermill_inbox.lock_timeout', current_setting('lock_timeout'), true)),
lt AS (SELECT set_config('lock_timeout', '%dms', true) FROM prev)
`, max(c.ClaimTimeout.Milliseconds(), 1))
}

// pgRestoreLockTimeout gives the handler the lock_timeout the session had
// before pgClaimTimeout.
const pgRestoreLockTimeout = `SELECT set_config('lock_timeout', current_setting('watermill_inbox.lock_timeout'), true)`

func (postgresql) claimTimeoutLimit() (time.Duration, string) {
	return pgMaxTimeout, "PostgreSQL's lock_timeout"
}

func (postgresql) classify(err error) error {
	switch pgCode(err) {
	case "55P03": // lock_not_available: lock_timeout expired
		return fmt.Errorf("%w: %w", inbox.ErrInFlight, err)
	case "42P01": // undefined_table
		return fmt.Errorf("inbox table does not exist, run Store.CreateSchema or apply Store.SchemaSQL: %w", err)
	case "26000", "42P05": // a prepared statement missing, or there already
		return fmt.Errorf("%w: %w", errPooler, err)
	}
	return err
}

// errPooler explains a prepared statement PostgreSQL lost between two
// statements of one client connection.
var errPooler = errors.New("a transaction-pooling proxy (PgBouncer pool_mode=transaction before 1.21) gave this connection another server connection between two statements: set sqlinbox.Config.TransactionPooling, and in the DSN binary_parameters=yes with lib/pq or default_query_exec_mode=exec with pgx (see docs/poolers.md)")

func quoteName(name string, q byte) string { return string(q) + name + string(q) }

// pgSchemaLock serialises concurrent CreateSchema calls: concurrent CREATE
// TABLE IF NOT EXISTS can still collide in the catalog (unique violation on
// pg_type), so instances starting together take turns on a
// transaction-scoped advisory lock. The table may not exist yet, so the key
// is its schema-qualified name, an unqualified one completed with the
// schema CREATE TABLE uses: "inbox" and "public.inbox" share the lock.
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
