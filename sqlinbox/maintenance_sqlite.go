package sqlinbox

import (
	"errors"
	"fmt"
	"time"
)

var _ maintenanceDialect = sqlite{}

func (sqlite) maintenanceQueries(t tableName, _ Config) maintenanceQueries {
	table := t.quoted('"')
	// Table-valued pragmas take the table, then the attached database.
	schema := "main"
	if t.schema != "" {
		schema = t.schema
	}
	pragma := func(fn, arg string) string { return fmt.Sprintf("pragma_%s('%s', '%s')", fn, arg, schema) }
	const claim = "event_id, processed_at"
	ids := func(n int) string { return placeholders(func(int) string { return "?" }, 2, n) }
	return maintenanceQueries{
		now: `SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')`,
		// processed_at is ISO 8601 UTC text, which sorts as it compares.
		consumerStats: fmt.Sprintf(`SELECT consumer, COUNT(*), MIN(processed_at), MAX(processed_at),
	SUM(processed_at >= strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now', '-1 hours')),
	SUM(processed_at >= strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now', '-1 days'))
FROM %s GROUP BY consumer`, table),
		// dbstat counts the pages of each b-tree; the table has no rowid,
		// so its primary key is the table's own b-tree.
		sizes: fmt.Sprintf(`SELECT (SELECT SUM(pgsize) FROM dbstat('%[1]s') WHERE name = '%[2]s'),
	(SELECT SUM(pgsize) FROM dbstat('%[1]s') WHERE name IN (SELECT name FROM %[3]s))`, schema, t.name, pragma("index_list", t.name)),
		consumers: "SELECT DISTINCT consumer FROM " + table,
		claimsOf: func(n int) string {
			return fmt.Sprintf("SELECT %s FROM %s WHERE consumer = ? AND event_id IN (%s)", claim, table, ids(n))
		},
		claimsBetween: fmt.Sprintf("SELECT %s FROM %s WHERE consumer = ? AND processed_at >= ? AND processed_at < ?", claim, table),
		timeArg:       sqliteTime,
		forgetDelete: func(n int) string {
			return fmt.Sprintf("DELETE FROM %s WHERE consumer = ? AND event_id IN (%s) RETURNING %s", table, ids(n), claim)
		},
		columns:     fmt.Sprintf("SELECT name, type FROM %s ORDER BY cid", pragma("table_info", t.name)),
		primaryKey:  fmt.Sprintf("SELECT name FROM %s WHERE pk > 0 ORDER BY pk", pragma("table_info", t.name)),
		indexLeads:  fmt.Sprintf("SELECT ii.name FROM %s AS il, pragma_index_info(il.name, '%s') AS ii WHERE ii.seqno = 0", pragma("index_list", t.name), schema),
		wantColumns: map[string]string{"consumer": "text", "event_id": "text", "processed_at": "text", "fingerprint": "blob"},
		dropTable:   "DROP TABLE IF EXISTS " + table,
		// SQLite has no DROP COLUMN IF EXISTS.
		dropFingerprint: "ALTER TABLE " + table + " DROP COLUMN fingerprint",
	}
}

// sqliteTime renders a bound for processed_at, which holds milliseconds:
// rounded up to the next millisecond, so that a comparison with the
// stored text (".123Z" sorts after ".1235Z") means what it does with the
// time itself.
func sqliteTime(at time.Time) any {
	at = at.UTC()
	if r := at.Truncate(time.Millisecond); r.Before(at) {
		at = r.Add(time.Millisecond)
	}
	return at.Format("2006-01-02T15:04:05.000Z")
}

// sqliteReadOnly is SQLITE_READONLY: a file opened read-only (mode=ro) or
// without write permission.
const sqliteReadOnly = 8

func (sqlite) readOnly(err error) bool {
	var e sqliteCoder
	return errors.As(err, &e) && e.Code()&0xff == sqliteReadOnly
}
