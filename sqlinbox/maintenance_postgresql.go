package sqlinbox

import (
	"database/sql"
	"fmt"
	"time"
)

var _ maintenanceDialect = postgresql{}

func (postgresql) maintenanceQueries(t tableName, c Config) maintenanceQueries {
	table := t.quoted('"')
	// The table's OID, NULL when it does not exist; the catalog queries
	// then find nothing.
	reg := fmt.Sprintf(`to_regclass('%s')`, table)
	idType := "text"
	if c.UUIDEventIDs {
		idType = "uuid"
	}
	ids := func(cast string) func(n int) string {
		return func(n int) string {
			return placeholders(func(i int) string { return fmt.Sprintf("$%d::%s", i, cast) }, 2, n)
		}
	}
	claim := "event_id::text, " + pgUTC("processed_at")
	claimsOf := func(n int) string {
		return fmt.Sprintf(`SELECT %s FROM %s WHERE consumer = $1 AND event_id IN (%s)`, claim, table, ids(idType)(n))
	}
	q := maintenanceQueries{
		timeDefault: &localDefault{
			query: fmt.Sprintf(`SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
	JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
	WHERE d.adrelid = %s AND a.attname = 'processed_at'`, reg),
			local:   pgLocalDefault,
			side:    "east",
			migrate: fmt.Sprintf("ALTER TABLE %s ALTER COLUMN processed_at SET DEFAULT now()", table),
		},
		now: "SELECT " + pgUTC("now()"),
		consumerStats: fmt.Sprintf(`SELECT consumer, count(*), %s, %s,
	count(*) FILTER (WHERE processed_at >= now() - interval '1 hour'),
	count(*) FILTER (WHERE processed_at >= now() - interval '1 day')
FROM %s GROUP BY consumer`, pgUTC("min(processed_at)"), pgUTC("max(processed_at)"), table),
		// A partitioned table has no storage of its own: its partitions
		// (the leaves of its tree) hold the rows and the indexes.
		sizes: fmt.Sprintf(`SELECT sum(pg_table_size(r)), sum(pg_indexes_size(r)) FROM (
	SELECT relid FROM pg_partition_tree(%[1]s) WHERE isleaf
	UNION SELECT %[1]s) AS p(r)`, reg),
		// reltuples is -1 until the first ANALYZE (PostgreSQL 14 and later).
		partitions: fmt.Sprintf(`SELECT c.relname::text, c.reltuples::bigint, COALESCE(pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT', false)
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s`, reg),
		consumers:       fmt.Sprintf(`SELECT DISTINCT consumer FROM %s`, table),
		claimsOf:        claimsOf,
		claimsBetween:   fmt.Sprintf(`SELECT %s FROM %s WHERE consumer = $1 AND processed_at >= $2 AND processed_at < $3`, claim, table),
		timeArg:         func(at time.Time) any { return at.UTC() },
		forgetIsolation: sql.LevelReadCommitted,
		forgetDelete: func(n int) string {
			return fmt.Sprintf(`DELETE FROM %s WHERE consumer = $1 AND event_id IN (%s) RETURNING %s`, table, ids(idType)(n), claim)
		},
		kind: fmt.Sprintf(`SELECT relkind::text || COALESCE(' ' || pg_get_partkeydef(oid), '') FROM pg_class WHERE oid = %s`, reg),
		// A domain's values are its base type's, and so are their
		// comparisons: domains (over domains) are resolved to it.
		columns: fmt.Sprintf(`WITH RECURSIVE c(attnum, name, typ, mod) AS (
	SELECT attnum, attname::text, atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped
	UNION ALL
	SELECT c.attnum, c.name, t.typbasetype, t.typtypmod FROM c JOIN pg_type t ON t.oid = c.typ WHERE t.typtype = 'd'
)
SELECT c.name, format_type(c.typ, c.mod) FROM c JOIN pg_type t ON t.oid = c.typ WHERE t.typtype <> 'd' ORDER BY c.attnum`, reg),
		primaryKey: fmt.Sprintf(`SELECT a.attname::text FROM pg_index i
	CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
	JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.n`, reg),
		indexLeads:  fmt.Sprintf(`SELECT a.attname::text FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] WHERE i.indrelid = %s`, reg),
		wantColumns: map[string]string{"consumer": "text", "event_id": idType, "processed_at": "timestamp with time zone", "fingerprint": "bytea"},
		// A partitioned table's partitions go with it.
		dropTable:       "DROP TABLE IF EXISTS " + table,
		dropFingerprint: "ALTER TABLE " + table + " DROP COLUMN IF EXISTS fingerprint",
	}
	if c.PartitionKey == EventIDTime {
		q.wantColumns["event_time"] = "timestamp with time zone"
		q.consumerStats = fmt.Sprintf(`SELECT consumer, count(*), %s, %s,
	count(*) FILTER (WHERE processed_at >= now() - interval '1 hour'),
	count(*) FILTER (WHERE processed_at >= now() - interval '1 day'),
	%s, %s
FROM %s GROUP BY consumer`, pgUTC("min(processed_at)"), pgUTC("max(processed_at)"), pgUTC("min(event_time)"), pgUTC("max(event_time)"), table)
		// The lookups of ids take each id's time after the ids, as the
		// probe does: (id, time) pairs, so that each id is looked up in
		// its partition only. Without the time, every partition is read.
		keys := func(n int) string {
			return placeholders(func(i int) string { return fmt.Sprintf("($%d::%s, $%d::timestamptz)", i, idType, i+n) }, 2, n)
		}
		// A lateral subquery with a LIMIT is not flattened into a join:
		// it runs once per id, and PostgreSQL prunes the partitions for
		// each run to the one holding the id's time.
		q.claimsOf = func(n int) string {
			return fmt.Sprintf(`SELECT c.id, c.at FROM (VALUES %s) AS k(id, at)
CROSS JOIN LATERAL (SELECT event_id::text, %s FROM %s WHERE consumer = $1 AND event_time = k.at AND event_id = k.id LIMIT 1) AS c(id, at)`, keys(n), pgUTC("processed_at"), table)
		}
		// The planner does not count the pruning a nested loop over the
		// ids gets, each id's lookup in one partition: it prefers a hash
		// join, or a loop over every partition's rows, that reads every
		// partition. forgetSetup leaves it, for the transaction, the loop
		// over the ids with an index lookup each.
		q.forgetSetup = `SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true), set_config('enable_seqscan', 'off', true)`
		q.forgetDelete = func(n int) string {
			return fmt.Sprintf(`DELETE FROM %s USING (VALUES %s) AS k(id, at) WHERE consumer = $1 AND event_time = k.at AND event_id = k.id RETURNING %s`, table, keys(n), claim)
		}
		// Each id's time routes its placeholder to the partition its
		// claim would go to, where the key's index entry is the lock.
		q.forgetProbe = func(n int) string {
			rows := placeholders(func(i int) string {
				return fmt.Sprintf("($1::text, $%d::%s, $%d::timestamptz)", i, idType, i+n)
			}, 2, n)
			return fmt.Sprintf(`INSERT INTO %s (consumer, event_id, event_time) VALUES %s ON CONFLICT DO NOTHING RETURNING event_id::text`, table, rows)
		}
	} else if c.Partitioning != NoPartitioning {
		// The claim's own lock on each event, in the ids' order: VALUES
		// yields its rows in order, and count() evaluates each.
		q.forgetLock = func(n int) string {
			rows := placeholders(func(i int) string { return fmt.Sprintf("($%d::text)", i) }, 2, n)
			return fmt.Sprintf(`SELECT count(%s) FROM (VALUES %s) AS e(id)`, pgEventLock(t, "$1::text", "e.id"), rows)
		}
	} else {
		q.forgetProbe = func(n int) string {
			rows := placeholders(func(i int) string { return fmt.Sprintf("($1::text, $%d::%s)", i, idType) }, 2, n)
			return fmt.Sprintf(`INSERT INTO %s (consumer, event_id) VALUES %s ON CONFLICT DO NOTHING RETURNING event_id::text`, table, rows)
		}
	}
	return q
}

// pgUTC renders a timestamptz expression as UTC RFC 3339 text with
// microseconds, whatever the session's DateStyle and TimeZone.
func pgUTC(expr string) string {
	return fmt.Sprintf(`to_char((%s) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`, expr)
}

func (postgresql) readOnly(err error) bool {
	switch pgCode(err) {
	case "42501", // insufficient_privilege
		"25006": // read_only_sql_transaction: a standby, or default_transaction_read_only
		return true
	}
	return false
}
