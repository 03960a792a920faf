package sqlinbox

import (
	"database/sql"
	"fmt"
	"time"
)

var _ maintenanceDialect = mysqlDialect{}

func (mysqlDialect) maintenanceQueries(t tableName, c Config) maintenanceQueries {
	table := t.quoted('`')
	schema := "DATABASE()"
	if t.schema != "" {
		schema = "'" + t.schema + "'"
	}
	where := fmt.Sprintf("table_schema = %s AND table_name = '%s'", schema, t.name)
	idType, idValue, idText := "varbinary(255)", "?", "event_id"
	if c.UUIDEventIDs {
		// BINARY(16) back to the canonical text CheckEventID returns.
		idType, idValue = "binary(16)", "UNHEX(REPLACE(?, '-', ''))"
		idText = "LOWER(INSERT(INSERT(INSERT(INSERT(HEX(event_id), 9, 0, '-'), 14, 0, '-'), 19, 0, '-'), 24, 0, '-'))"
	}
	utc := func(expr string) string { return fmt.Sprintf("DATE_FORMAT(%s, '%%Y-%%m-%%dT%%H:%%i:%%s.%%fZ')", expr) }
	claim := idText + ", " + utc("processed_at")
	ids := func(n int) string { return placeholders(func(int) string { return idValue }, 2, n) }
	claimsOf := func(n int) string {
		return fmt.Sprintf("SELECT %s FROM %s WHERE consumer = ? AND event_id IN (%s)", claim, table, ids(n))
	}
	wantColumns := map[string]string{"consumer": "varbinary(255)", "event_id": idType, "processed_at": "datetime(6)", "fingerprint": "varbinary(64)"}
	if c.ShardKeyColumn != "" {
		wantColumns[c.ShardKeyColumn] = fmt.Sprintf("varbinary(%d)", MaxShardKeyLength)
	}
	return maintenanceQueries{
		now: "SELECT " + utc("UTC_TIMESTAMP(6)"),
		// processed_at is UTC from the database clock (see the schema).
		consumerStats: fmt.Sprintf(`SELECT consumer, COUNT(*), %s, %s,
	SUM(processed_at >= UTC_TIMESTAMP(6) - INTERVAL 1 HOUR),
	SUM(processed_at >= UTC_TIMESTAMP(6) - INTERVAL 1 DAY)
FROM %s GROUP BY consumer`, utc("MIN(processed_at)"), utc("MAX(processed_at)"), table),
		// InnoDB's estimates; MAX makes one row, NULL when the table is
		// not there.
		sizes:           "SELECT MAX(data_length), MAX(index_length) FROM information_schema.tables WHERE " + where,
		consumers:       "SELECT DISTINCT consumer FROM " + table,
		claimsOf:        claimsOf,
		claimsBetween:   fmt.Sprintf("SELECT %s FROM %s WHERE consumer = ? AND processed_at >= ? AND processed_at < ?", claim, table),
		timeArg:         func(at time.Time) any { return at.UTC().Format("2006-01-02 15:04:05.999999") },
		forgetIsolation: sql.LevelRepeatableRead,
		// The locking read waits for a claim in flight (its row's lock)
		// and reads the latest committed rows; DELETE cannot return them
		// on MySQL 8.
		forgetLockRows: func(n int) string { return claimsOf(n) + " FOR UPDATE" },
		forgetDelete: func(n int) string {
			return fmt.Sprintf("DELETE FROM %s WHERE consumer = ? AND event_id IN (%s)", table, ids(n))
		},
		columns:     "SELECT column_name, column_type FROM information_schema.columns WHERE " + where + " ORDER BY ordinal_position",
		primaryKey:  "SELECT column_name FROM information_schema.statistics WHERE " + where + " AND index_name = 'PRIMARY' ORDER BY seq_in_index",
		indexLeads:  "SELECT column_name FROM information_schema.statistics WHERE " + where + " AND seq_in_index = 1",
		wantColumns: wantColumns,
		timeDefault: &localDefault{
			query:   "SELECT column_default FROM information_schema.columns WHERE " + where + " AND column_name = 'processed_at'",
			local:   mysqlLocalDefault,
			side:    "west",
			migrate: fmt.Sprintf("ALTER TABLE %s MODIFY processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))", table),
		},
		dropTable:       "DROP TABLE IF EXISTS " + table,
		dropFingerprint: "ALTER TABLE " + table + " DROP COLUMN IF EXISTS fingerprint",
	}
}

// MySQL and MariaDB error numbers of a refused write.
const (
	mysqlDBAccessDenied    = 1044 // ER_DBACCESS_DENIED_ERROR
	mysqlTableAccessDenied = 1142 // ER_TABLEACCESS_DENIED_ERROR: DELETE command denied to user
	mysqlReadOnlyServer    = 1290 // ER_OPTION_PREVENTS_STATEMENT: --read-only
	mysqlReadOnlyTx        = 1792 // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
)

func (mysqlDialect) readOnly(err error) bool {
	number, _ := mysqlErrorNumber(err)
	switch number {
	case mysqlDBAccessDenied, mysqlTableAccessDenied, mysqlReadOnlyServer, mysqlReadOnlyTx:
		return true
	}
	return false
}
