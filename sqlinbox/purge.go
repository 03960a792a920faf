package sqlinbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ErrPurgeTimeout means one purge statement ran longer than the timeout
// given to PurgeSession.DeleteBatch and was cancelled by the database;
// nothing of that batch was deleted. The purge package answers it with a
// smaller batch.
var ErrPurgeTimeout = errors.New("sqlinbox: purge statement timed out")

// PurgeScope selects the rows one purge pass removes: those whose
// processed_at is more than OlderThan before the database's clock (never the
// application's, so instances with skewed clocks agree), for one consumer or
// for every consumer but some.
type PurgeScope struct {
	// OlderThan is the retention: rows younger than this stay.
	OlderThan time.Duration
	// Consumer limits the pass to one consumer. When empty, the pass covers
	// every consumer not listed in Except.
	Consumer string
	// Except lists consumers the pass leaves alone (those with their own
	// retention). Ignored when Consumer is set.
	Except []string
}

// purgeDialect is what a dialect offers the purge, kept apart from Dialect
// so a dialect without it still stores claims.
type purgeDialect interface {
	purgeQueries(t tableName, c Config) purgeQueries
	// statementTimedOut reports whether err is the database cancelling a
	// statement for running past its timeout.
	statementTimedOut(err error) bool
	purgeLimits() PurgeLimits
}

// PurgeLimits are the longest timeouts a database takes for the purge's
// statements; package purge refuses a Config beyond them, since every
// batch or partition change would fail. Zero means no limit: the dialect
// does not use that timeout (SQLite neither; MySQL 8 no statement timeout).
type PurgeLimits struct {
	// StatementTimeout bounds the timeout of PurgeSession.DeleteBatch:
	// PostgreSQL's statement_timeout, MariaDB's max_statement_time.
	StatementTimeout time.Duration
	// LockTimeout bounds the lockTimeout of PurgeSession.CreatePartitions
	// and DropPartition: PostgreSQL's lock_timeout.
	LockTimeout time.Duration
}

// PurgeLimits returns the longest purge timeouts the store's database
// takes. Package purge checks its Config against them.
func (s *Store) PurgeLimits() PurgeLimits {
	if pd, ok := s.dialect.(purgeDialect); ok {
		return pd.purgeLimits()
	}
	return PurgeLimits{}
}

// purgeQueries holds the purge's SQL text. Bind parameters come in one
// order for every dialect, so positional "?" placeholders line up:
// retention in microseconds, then the consumer or the excluded consumers,
// then the batch size.
type purgeQueries struct {
	// tryLock takes the table's session-level purge lock without waiting
	// and returns one row: the lock's key, and 1 when taken; "" when the
	// database needs no lock (SQLite serialises writers itself). unlock
	// releases it, with that key as its only argument: the key is the
	// table's identity, resolved once, so the lock taken is the lock
	// released even if the table is recreated meanwhile.
	tryLock, unlock string
	// setTimeout bounds the statements that follow in the batch's
	// transaction; its argument is milliseconds as text. "" when the
	// timeout is part of deleteBatch's text instead.
	setTimeout string
	// deleteBatch removes at most limit expired rows, oldest first, using
	// the processed_at index. timeout is embedded by dialects that cannot
	// set it with a bound parameter (0: none).
	deleteBatch func(s scopeShape, timeout time.Duration) string
	// countExpired returns (consumer, rows) for the expired rows of scope.
	countExpired func(s scopeShape) string
	// adapt, when set, adjusts the queries to the server behind the
	// session's connection (MySQL or MariaDB), once per session.
	adapt func(ctx context.Context, conn *sql.Conn, q *purgeQueries) error
}

// scopeShape is what of a PurgeScope changes the SQL text.
type scopeShape struct {
	consumer bool // consumer = ?
	except   int  // consumer NOT IN (?, ...)
}

func (sc PurgeScope) shape() scopeShape {
	if sc.Consumer != "" {
		return scopeShape{consumer: true}
	}
	return scopeShape{except: len(sc.Except)}
}

// args returns the bind parameters for scope, in the documented order.
func (sc PurgeScope) args(limit ...int) []any {
	args := []any{sc.OlderThan.Microseconds()}
	if sc.Consumer != "" {
		args = append(args, sc.Consumer)
	} else {
		for _, c := range sc.Except {
			args = append(args, c)
		}
	}
	for _, l := range limit {
		args = append(args, l)
	}
	return args
}

// scopeFilter renders the consumer condition of a purge query; ph renders
// the n-th (1-based) placeholder, first is the number of the first one.
func scopeFilter(s scopeShape, ph func(n int) string, first int) string {
	switch {
	case s.consumer:
		return " AND consumer = " + ph(first)
	case s.except > 0:
		f := " AND consumer NOT IN ("
		for i := range s.except {
			if i > 0 {
				f += ", "
			}
			f += ph(first + i)
		}
		return f + ")"
	}
	return ""
}

func (s scopeShape) params() int {
	if s.consumer {
		return 1
	}
	return s.except
}

// PurgeSession is one purge round on a dedicated connection that holds the
// table's purge lock, so that several instances running the purge never
// work at the same time. Package purge drives it; most programs use that
// package rather than this type. Close it to release the lock and the
// connection.
type PurgeSession struct {
	s    *Store
	pd   purgeDialect
	q    purgeQueries
	conn *sql.Conn
	key  string
	held bool
}

// BeginPurge opens a purge session. When another session holds the table's
// purge lock it returns nil and false without waiting: that instance is
// already doing the work.
func (s *Store) BeginPurge(ctx context.Context) (*PurgeSession, bool, error) {
	pd, ok := s.dialect.(purgeDialect)
	if !ok {
		return nil, false, fmt.Errorf("sqlinbox: the %s dialect has no purge", s.dialect)
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("sqlinbox: purge of %s: %w", s.table, err)
	}
	p := &PurgeSession{s: s, pd: pd, q: pd.purgeQueries(s.table, s.config), conn: conn}
	if p.q.adapt != nil {
		if err := p.q.adapt(ctx, conn, &p.q); err != nil {
			_ = conn.Close()
			return nil, false, fmt.Errorf("sqlinbox: purge of %s: %w", s.table, err)
		}
	}
	if p.q.tryLock == "" {
		return p, true, nil
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, p.q.tryLock).Scan(&p.key, &got); err != nil {
		_ = conn.Close()
		return nil, false, fmt.Errorf("sqlinbox: taking the purge lock of %s: %w", s.table, s.dialect.classify(err))
	}
	if got.Int64 != 1 {
		_ = conn.Close()
		return nil, false, nil
	}
	p.held = true
	return p, true, nil
}

// Close releases the purge lock and the connection. If the lock cannot be
// released, the connection is discarded rather than returned to the pool,
// which ends the database session and the lock with it.
func (p *PurgeSession) Close() error {
	if p.held {
		p.held = false
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := p.conn.ExecContext(ctx, p.q.unlock, p.key); err != nil {
			// driver.ErrBadConn from Raw makes database/sql close the
			// connection instead of pooling it.
			_ = p.conn.Raw(func(any) error { return driver.ErrBadConn })
			_ = p.conn.Close()
			return fmt.Errorf("sqlinbox: releasing the purge lock of %s: %w", p.s.table, err)
		}
	}
	return p.conn.Close()
}

// DeleteBatch deletes at most limit rows of scope, oldest first, in one
// transaction, and returns how many it deleted. A statement running longer
// than timeout (0: no limit) is cancelled by the database and reported as
// an error wrapping ErrPurgeTimeout.
func (p *PurgeSession) DeleteBatch(ctx context.Context, scope PurgeScope, limit int, timeout time.Duration) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("sqlinbox: purge batch size must be positive, got %d", limit)
	}
	tx, err := p.conn.BeginTx(ctx, nil)
	if err != nil {
		return 0, p.fail(ctx, "purging", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	if timeout > 0 && p.q.setTimeout != "" {
		ms := strconv.FormatInt(max(timeout.Milliseconds(), 1), 10)
		if _, err := tx.ExecContext(ctx, p.q.setTimeout, ms); err != nil {
			return 0, p.fail(ctx, "purging", err)
		}
	}
	res, err := tx.ExecContext(ctx, p.q.deleteBatch(scope.shape(), timeout), scope.args(limit)...)
	if err != nil {
		return 0, p.fail(ctx, "purging", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, p.fail(ctx, "purging", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, p.fail(ctx, "purging", err)
	}
	return n, nil
}

// CountExpired returns, per consumer, how many rows of scope are old enough
// for DeleteBatch to remove. It deletes nothing (a dry run).
func (p *PurgeSession) CountExpired(ctx context.Context, scope PurgeScope) (map[string]int64, error) {
	rows, err := p.conn.QueryContext(ctx, p.q.countExpired(scope.shape()), scope.args()...)
	if err != nil {
		return nil, p.fail(ctx, "counting expired rows of", err)
	}
	return scanCounts(rows)
}

func scanCounts(rows *sql.Rows) (map[string]int64, error) {
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var consumer string
		var n int64
		if err := rows.Scan(&consumer, &n); err != nil {
			return nil, err
		}
		out[consumer] += n
	}
	return out, rows.Err()
}

// fail wraps err, recognising statement timeouts. A cancelled context also
// makes some databases report a cancelled statement, so it is checked
// first.
func (p *PurgeSession) fail(ctx context.Context, doing string, err error) error {
	if ctx.Err() == nil && p.pd.statementTimedOut(err) {
		return fmt.Errorf("sqlinbox: %s %s: %w: %w", doing, p.s.table, ErrPurgeTimeout, err)
	}
	return fmt.Errorf("sqlinbox: %s %s: %w", doing, p.s.table, p.s.dialect.classify(err))
}
