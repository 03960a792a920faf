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
	// MariaDB can scope a time limit to one statement; a lock wait counts
	// towards it. Milliseconds at least: 0.000 is no limit.
	limited := func(stmt string, timeout time.Duration, mariaDB bool) string {
		if timeout <= 0 || !mariaDB {
			return stmt
		}
		secs := max(timeout, time.Millisecond).Seconds()
		return fmt.Sprintf("SET STATEMENT max_statement_time=%s FOR %s", strconv.FormatFloat(secs, 'f', 3, 64), stmt)
	}
	// A batch is two statements, each its own transaction, rather than
	// one DELETE ... ORDER BY processed_at LIMIT n: Vitess runs a DELETE
	// with LIMIT on a sharded table as a read and a delete in a
	// transaction across shards, which transaction_mode SINGLE refuses.
	// The read uses the processed_at index for both the range and the
	// order; the delete finds its rows by primary key.
	selectBatch := func(s scopeShape, timeout time.Duration, mariaDB bool) string {
		return limited(fmt.Sprintf("SELECT consumer, event_id FROM %s WHERE %s%s ORDER BY processed_at LIMIT ?", table, expired, scopeFilter(s, question, 2)), timeout, mariaDB)
	}
	deleteKeys := func(perConsumer []int, timeout time.Duration, mariaDB bool) string {
		var b strings.Builder
		for i, n := range perConsumer {
			if i > 0 {
				b.WriteString(" OR ")
			}
			b.WriteString("(consumer = ? AND event_id IN (" + placeholders(question, 1, n) + "))")
		}
		// The comment lets vtgate commit the DELETE on each shard on its
		// own (MySQL ignores it); a row removed is removed for good, so a
		// shard that fails leaves only rows the next batch removes.
		return limited(fmt.Sprintf("DELETE /*vt+ MULTI_SHARD_AUTOCOMMIT=1 */ FROM %s WHERE %s AND (%s)", table, expired, b.String()), timeout, mariaDB)
	}
	q := purgeQueries{
		countExpired: func(s scopeShape) string {
			return fmt.Sprintf("SELECT consumer, COUNT(*) FROM %s WHERE %s%s GROUP BY consumer", table, expired, scopeFilter(s, question, 2))
		},
	}
	setServer := func(q *purgeQueries, mariaDB bool) {
		q.selectBatch = func(s scopeShape, timeout time.Duration) string { return selectBatch(s, timeout, mariaDB) }
		q.deleteKeys = func(perConsumer []int, timeout time.Duration) string {
			return deleteKeys(perConsumer, timeout, mariaDB)
		}
	}
	setServer(&q, true)
	// MySQL 8 has no per-statement time limit for a DELETE
	// (MAX_EXECUTION_TIME covers SELECT only): there a batch is bounded by
	// its size and by innodb_lock_wait_timeout. Vitess's vtgate answers
	// as MySQL 8 and has no SET STATEMENT either.
	q.adapt = func(ctx context.Context, conn *sql.Conn, q *purgeQueries) error {
		var version string
		if err := conn.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
			return err
		}
		setServer(q, strings.Contains(strings.ToLower(version), "mariadb"))
		return nil
	}
	return q
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
// processlist's TIME of that session counting from when it took the lock,
// which tells a skipped round how long the lock has been held.
//
// Each lock function runs in a SELECT of its own, without FROM or any other
// expression: Vitess's vtgate runs lock functions only so, on a session of
// their own on one shard of the keyspace. The holder is known by the id
// IS_USED_LOCK reports, not by CONNECTION_ID(), which through vtgate is
// the id of whichever connection ran that statement.
type mysqlPurgeLock struct {
	conn *sql.Conn
	name string
	id   int64 // the lock's holder, as IS_USED_LOCK reports it
}

func (mysqlDialect) lockPurge(ctx context.Context, db *sql.DB, t tableName) (purgeLock, *maintenance.Busy, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	l := &mysqlPurgeLock{conn: conn}
	var got sql.NullInt64
	err = conn.QueryRowContext(ctx, "SELECT "+mysqlPurgeLockName(t)).Scan(&l.name)
	if err == nil {
		// GET_LOCK with timeout 0 does not wait.
		err = conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", l.name).Scan(&got)
	}
	if err == nil && got.Int64 == 1 {
		err = conn.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", l.name).Scan(&l.id)
		if err == nil {
			return l, nil, nil
		}
	}
	if err != nil {
		discard(conn)
		return nil, nil, err
	}
	defer conn.Close()
	var holder sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", l.name).Scan(&holder); err != nil {
		return nil, nil, err
	}
	busy := &maintenance.Busy{}
	if !holder.Valid { // released meanwhile
		return nil, busy, nil
	}
	busy.Holder = fmt.Sprintf("MySQL connection %d", holder.Int64)
	// The holder's session is idle since it took the lock, so its TIME
	// counts from then; NULL when this user may not see it (or, through
	// vtgate, when another shard answers).
	var secs sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT MAX(TIME) FROM information_schema.PROCESSLIST WHERE ID = ?", holder.Int64).Scan(&secs); err != nil {
		return nil, nil, err
	}
	busy.Known, busy.HeldFor = secs.Valid, time.Duration(secs.Int64)*time.Second
	return nil, busy, nil
}

// check asks the server, from the round's connection so that the lock's
// stays idle, whether the lock's session still holds it.
func (l *mysqlPurgeLock) check(ctx context.Context, conn *sql.Conn) error {
	var holder sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", l.name).Scan(&holder); err != nil {
		return err
	}
	if holder.Int64 != l.id {
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
