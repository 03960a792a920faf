package sqlinbox

import (
	"fmt"
)

// idTimeQueries is the PostgreSQL schema and claim of a table partitioned
// by the time inside event ids ([EventIDTime]).
//
// The time is a function of the id, so every copy of an event lands in the
// same partition and the primary key (consumer, event_time, event_id) sees
// every duplicate: the claim is the plain table's ON CONFLICT DO NOTHING,
// with the id's time as third parameter, computed by the store. The key
// leads with the time after the consumer, so the oldest claim is one probe
// per consumer and partition, and a table needs no time index of its own:
// the purge drops whole partitions. Only the default partition, which
// holds the few events no partition covers, has an index on event_time,
// for its batched deletes.
func idTimeQueries(t tableName, c Config, idType, fpCol string) queries {
	table := t.quoted('"')
	cols, vals := "consumer, event_id, event_time", "$1::text, $2::"+idType+", $3::timestamptz"
	if c.Fingerprints {
		cols, vals = cols+", fingerprint", vals+", $4::bytea"
	}
	def := t.derived(defaultPartitionSuffix)
	q := queries{
		schema: []string{
			pgCreateTable(table, idType, "\n\tevent_time   timestamptz NOT NULL,"+fpCol, "consumer, event_time, event_id", " PARTITION BY RANGE (event_time)"),
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF %s DEFAULT`, def.quoted('"'), table),
			fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (event_time)`, quoteName(def.derived("event_time_idx").name, '"'), def.quoted('"')),
			pgCreatePartitions(t, c),
		},
		schemaObjects: []tableName{t, def, def.derived("event_time_idx"), partitionsStep},
		idTime:        true,
		// A loose index scan: each consumer found by one probe of the key
		// (per partition), then its oldest event_time by one more.
		oldest: fmt.Sprintf(`WITH RECURSIVE c(consumer) AS (
	(SELECT consumer FROM %[1]s ORDER BY consumer LIMIT 1)
	UNION ALL
	SELECT (SELECT consumer FROM %[1]s WHERE consumer > c.consumer ORDER BY consumer LIMIT 1) FROM c WHERE c.consumer IS NOT NULL
)
SELECT %[2]s FROM (SELECT (SELECT min(event_time) FROM %[1]s WHERE consumer = c.consumer) AS m FROM c WHERE c.consumer IS NOT NULL) o`, table, pgUTC("min(m)")),
		addFingerprint: fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS fingerprint bytea`, table),
	}
	q.claim, q.afterClaim = pgInsertClaim(c.ClaimTimeout, table, cols, vals)
	if c.Fingerprints {
		q.fingerprint = fmt.Sprintf(`SELECT fingerprint FROM %s WHERE consumer = $1 AND event_id = $2 AND event_time = $3`, table)
	}
	q.verify = verifyLayout(t, c)
	return q
}
