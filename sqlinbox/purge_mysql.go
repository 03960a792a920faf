package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

var _ purgeDialect = mysqlDialect{}

func (mysqlDialect) purgeQueries(t tableName, _ Config) purgeQueries {
	table := t.quoted('`')
	question := func(int) string { return "?" }
	// processed_at is UTC from the database clock (see the schema).
	const expired = "processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND"
	// GET_LOCK names are server-wide and at most 64 characters: hash the
	// schema-qualified table, an unqualified name completed with the
	// connection's database, so "inbox" and "app.inbox" share the lock.
	schema := "COALESCE(DATABASE(), '')"
	if t.schema != "" {
		schema = "'" + t.schema + "'"
	}
	lockName := fmt.Sprintf("CONCAT('inbox_purge_', SHA1(CONCAT('watermill_inbox purge ', %s, '.', '%s')))", schema, t.name)
	deleteBatch := func(s scopeShape, timeout time.Duration, mariaDB bool) string {
		// The processed_at index serves both the range and the order, so
		// the DELETE reads only the rows it removes.
		stmt := fmt.Sprintf("DELETE FROM %s WHERE %s%s ORDER BY processed_at LIMIT ?", table, expired, scopeFilter(s, question, 2))
		if timeout > 0 && mariaDB {
			// MariaDB can scope a time limit to one statement; a lock wait
			// counts towards it. Milliseconds at least: 0.000 is no limit.
			secs := max(timeout, time.Millisecond).Seconds()
			stmt = fmt.Sprintf("SET STATEMENT max_statement_time=%s FOR %s", strconv.FormatFloat(secs, 'f', 3, 64), stmt)
		}
		return stmt
	}
	return purgeQueries{
		// GET_LOCK with timeout 0 does not wait. The lock belongs to the
		// purge's dedicated connection and dies with its session.
		tryLock: "SELECT name, COALESCE(GET_LOCK(name, 0), 0) FROM (SELECT " + lockName + " AS name) t",
		unlock:  "SELECT RELEASE_LOCK(?)",
		deleteBatch: func(s scopeShape, timeout time.Duration) string {
			return deleteBatch(s, timeout, true)
		},
		countExpired: func(s scopeShape) string {
			return fmt.Sprintf("SELECT consumer, COUNT(*) FROM %s WHERE %s%s GROUP BY consumer", table, expired, scopeFilter(s, question, 2))
		},
		// MySQL 8 has no per-statement time limit for a DELETE
		// (MAX_EXECUTION_TIME covers SELECT only): there a batch is bounded
		// by its size and by innodb_lock_wait_timeout.
		adapt: func(ctx context.Context, conn *sql.Conn, q *purgeQueries) error {
			var version string
			if err := conn.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
				return err
			}
			if !strings.Contains(strings.ToLower(version), "mariadb") {
				q.deleteBatch = func(s scopeShape, timeout time.Duration) string { return deleteBatch(s, timeout, false) }
			}
			return nil
		},
	}
}

// MySQL and MariaDB error numbers of a statement stopped by a time limit.
const (
	mariadbStatementTimeout = 1969 // ER_STATEMENT_TIMEOUT: max_statement_time
	mysqlQueryTimeout       = 3024 // ER_QUERY_TIMEOUT: max_execution_time
)

// mariadbMaxStatementTime is the longest max_statement_time MariaDB takes,
// a year; partitions, hence lock timeouts, are PostgreSQL's only.
const mariadbMaxStatementTime = 31_536_000 * time.Second

func (mysqlDialect) purgeLimits() maintenance.Limits {
	return maintenance.Limits{StatementTimeout: mariadbMaxStatementTime}
}

func (mysqlDialect) statementTimedOut(err error) bool {
	number, _ := mysqlErrorNumber(err)
	switch number {
	case mariadbStatementTimeout, mysqlQueryTimeout, mysqlLockWaitTimeout:
		return true
	}
	return false
}
