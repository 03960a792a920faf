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

// mysqlPurgeLockName is the name of t's purge lock. GET_LOCK names are
// server-wide and at most 64 characters: it hashes the schema-qualified
// table, an unqualified name completed with the connection's database, so
// "inbox" and "app.inbox" share the lock.
func mysqlPurgeLockName(t tableName) string {
	schema := "COALESCE(DATABASE(), '')"
	if t.schema != "" {
		schema = "'" + t.schema + "'"
	}
	return fmt.Sprintf("CONCAT('inbox_purge_', SHA1(CONCAT('watermill_inbox purge ', %s, '.', '%s')))", schema, t.name)
}

// mysqlPurgeLock is the purge lock of a MySQL or MariaDB table: a named
// lock (GET_LOCK), which belongs to a session, taken on a connection of its
// own that runs nothing else until the round ends. Held by the connection
// that runs the DELETEs, as before, it outlived a client killed mid-batch
// for as long as the server went on with that statement; idle, its session
// ends as soon as the client's socket closes. Idle also keeps the
// processlist's TIME of that session counting from GET_LOCK, which tells a
// skipped round how long the lock has been held.
type mysqlPurgeLock struct {
	conn *sql.Conn
	name string
	id   int64 // CONNECTION_ID() of conn
}

func (mysqlDialect) lockPurge(ctx context.Context, db *sql.DB, t tableName) (purgeLock, *maintenance.Busy, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	l := &mysqlPurgeLock{conn: conn}
	var got int
	// GET_LOCK with timeout 0 does not wait.
	err = conn.QueryRowContext(ctx, "SELECT name, COALESCE(GET_LOCK(name, 0), 0), CONNECTION_ID() FROM (SELECT "+mysqlPurgeLockName(t)+" AS name) t").Scan(&l.name, &got, &l.id)
	if err != nil {
		discard(conn)
		return nil, nil, err
	}
	if got == 1 {
		return l, nil, nil
	}
	defer conn.Close()
	// The holder's session is idle since it took the lock, so its TIME
	// counts from then; NULL when this user may not see it.
	var holder, secs sql.NullInt64
	err = conn.QueryRowContext(ctx, "SELECT h.id, (SELECT p.TIME FROM information_schema.PROCESSLIST p WHERE p.ID = h.id) FROM (SELECT IS_USED_LOCK(?) AS id) h", l.name).Scan(&holder, &secs)
	if err != nil {
		return nil, nil, err
	}
	busy := &maintenance.Busy{Known: secs.Valid, HeldFor: time.Duration(secs.Int64) * time.Second}
	if holder.Valid {
		busy.Holder = fmt.Sprintf("MySQL connection %d", holder.Int64)
	}
	return nil, busy, nil
}

// check asks the server, from the round's connection so that the lock's
// stays idle, whether the lock's session still holds it.
func (l *mysqlPurgeLock) check(ctx context.Context, conn *sql.Conn) error {
	var ours sql.NullBool
	if err := conn.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?) = ?", l.name, l.id).Scan(&ours); err != nil {
		return err
	}
	if !ours.Bool {
		return fmt.Errorf("the named lock %s is no longer held by connection %d (its session ended: wait_timeout, a restart, KILL)", l.name, l.id)
	}
	return nil
}

// release gives the lock up; when that fails the connection is discarded,
// which ends the session and the lock with it.
func (l *mysqlPurgeLock) release() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := l.conn.ExecContext(ctx, "SELECT RELEASE_LOCK(?)", l.name); err != nil {
		discard(l.conn)
		return err
	}
	return l.conn.Close()
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
