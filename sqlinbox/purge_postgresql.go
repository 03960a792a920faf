package sqlinbox

import (
	"context"
	"database/sql"
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
		// A session-level lock on the purge's dedicated connection, held
		// for the whole round. The two-int4 form lives in a lock space of
		// its own, apart from the claims' bigint advisory locks; its
		// second key is the table's OID, so every spelling of the table
		// name takes the same lock.
		tryLock:    fmt.Sprintf(`SELECT k::text, pg_try_advisory_lock(hashtext('watermill_inbox purge'), k)::int FROM (SELECT '%s'::regclass::oid::int AS k) t`, t.quoted('"')),
		unlock:     `SELECT pg_advisory_unlock(hashtext('watermill_inbox purge'), $1::int)`,
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

func (postgresql) purgeLimits() maintenance.Limits {
	return maintenance.Limits{StatementTimeout: pgMaxTimeout, LockTimeout: pgMaxTimeout}
}

func (postgresql) statementTimedOut(err error) bool {
	return pgCode(err) == "57014" // query_canceled, here by statement_timeout
}
