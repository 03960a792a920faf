package sqlinbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// purgeDialect is what a dialect offers the purge, kept apart from [Dialect]
// so a dialect without it still stores claims.
type purgeDialect interface {
	purgeQueries(t tableName, c Config) purgeQueries
	// lockPurge takes t's one-purger lock without waiting. It returns the
	// lock, or who holds it; neither where the database needs no lock
	// (SQLite serialises writers itself).
	lockPurge(ctx context.Context, db *sql.DB, t tableName) (purgeLock, *maintenance.Busy, error)
	// statementTimedOut reports whether err is the database cancelling a
	// statement for running past its timeout.
	statementTimedOut(err error) bool
	purgeLimits() maintenance.Limits
}

// purgeQueries holds the purge's SQL text. Bind parameters come in one
// order for every dialect, so positional "?" placeholders line up:
// retention in microseconds, then the consumer or the excluded consumers,
// then the batch size.
type purgeQueries struct {
	// setTimeout bounds the statements that follow in the batch's
	// transaction; its argument is milliseconds as text. "" when the
	// timeout is part of deleteBatch's text instead.
	setTimeout string
	// deleteBatch removes at most limit expired rows, oldest first, using
	// the processed_at index. timeout is embedded by dialects that cannot
	// set it with a bound parameter (0: none).
	deleteBatch func(s scopeShape, timeout time.Duration) string
	// selectBatch and deleteKeys, when set instead of deleteBatch, make a
	// batch two statements outside a transaction: selectBatch returns the
	// (consumer, event_id) of at most limit expired rows, oldest first;
	// deleteKeys removes those still expired, given how many event ids
	// each consumer has (parameters: the retention, then each consumer
	// followed by its ids).
	selectBatch func(s scopeShape, timeout time.Duration) string
	deleteKeys  func(perConsumer []int, timeout time.Duration) string
	// countExpired returns (consumer, rows) for the expired rows of scope.
	countExpired func(s scopeShape) string
	// adapt, when set, adjusts the queries to the server behind the
	// session's connection (MySQL or MariaDB), once per session.
	adapt func(ctx context.Context, conn *sql.Conn, q *purgeQueries) error
	// waitForBatch, when set, runs each batch's attempt on conn, waiting
	// for the write lock its own way (SQLite, purge_sqlite.go).
	waitForBatch func(ctx context.Context, conn *sql.Conn, attempt func() (int64, error)) (int64, error)
}

// scopeShape is what of a [maintenance.PurgeScope] changes the SQL text.
type scopeShape struct {
	consumer bool // consumer = ?
	except   int  // consumer NOT IN (?, ...)
}

func shapeOf(sc maintenance.PurgeScope) scopeShape {
	if sc.Consumer != "" {
		return scopeShape{consumer: true}
	}
	return scopeShape{except: len(sc.Except)}
}

// scopeArgs returns the bind parameters for sc, in the documented order.
func scopeArgs(sc maintenance.PurgeScope, limit ...int) []any {
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

// purgeLock is a table's one-purger lock, held for one round on a
// connection of its own, never the one that runs the round's statements:
// a client killed mid-batch then leaves an idle lock connection, whose
// session the server ends (and the lock with it) as soon as the client's
// socket closes, instead of a session that holds the lock until its
// statement finishes.
type purgeLock interface {
	// check fails when the lock is no longer held (its connection ended),
	// so that the round stops rather than run beside another; conn is the
	// round's connection.
	check(ctx context.Context, conn *sql.Conn) error
	// release gives the lock up and its connection back.
	release() error
}

// purgeSession implements [maintenance.PurgeSession]: the round's statements
// on a dedicated connection, the table's purge lock (where the database
// needs one) on another.
type purgeSession struct {
	s    *Store
	pd   purgeDialect
	q    purgeQueries
	conn *sql.Conn
	lock purgeLock
	// yield gives conn back to the pool after each batch: on a pool of
	// one (SQLite), a round holding the only connection would make every
	// claim wait for the whole round instead of one short batch.
	yield bool
	// margin lengthens every retention of the round, and localDefault
	// says why: the table's processed_at default follows the writer's
	// session (local_times.go).
	margin       time.Duration
	localDefault string
	localErr     error // reading the default failed: margin kept
}

var _ maintenance.PurgeSession = (*purgeSession)(nil)

// beginPurge implements [maintenance.Store.BeginPurge].
func (s *Store) beginPurge(ctx context.Context) (*purgeSession, *maintenance.Busy, error) {
	pd, ok := s.dialect.(purgeDialect)
	if !ok {
		return nil, nil, fmt.Errorf("sqlinbox: the %s dialect has no purge", s.dialect)
	}
	// The lock's connection and the round's: with one connection in the
	// pool the round would wait for the second forever.
	if n := s.db.Stats().MaxOpenConnections; n == 1 && s.dialect != SQLite {
		return nil, nil, fmt.Errorf("sqlinbox: purge of %s: a round holds two connections (the purge lock's and its statements'), and the *sql.DB allows one (SetMaxOpenConns): give the purge a pool of at least two", s.table)
	}
	lock, busy, err := pd.lockPurge(ctx, s.db, s.table)
	if err != nil {
		return nil, nil, fmt.Errorf("sqlinbox: taking the purge lock of %s: %w", s.table, s.dialect.classify(err))
	}
	if busy != nil {
		return nil, busy, nil
	}
	p := &purgeSession{s: s, pd: pd, q: pd.purgeQueries(s.table, s.config), lock: lock}
	p.yield = lock == nil && s.db.Stats().MaxOpenConnections == 1
	if p.conn, err = s.db.Conn(ctx); err != nil {
		_ = p.Close()
		return nil, nil, fmt.Errorf("sqlinbox: purge of %s: %w", s.table, err)
	}
	if p.q.adapt != nil {
		if err := p.q.adapt(ctx, p.conn, &p.q); err != nil {
			_ = p.Close()
			return nil, nil, fmt.Errorf("sqlinbox: purge of %s: %w", s.table, err)
		}
	}
	// Read every round, before any delete, so that a migration takes
	// effect at the next one. A default that cannot be read keeps the
	// margin: the purge goes on, a little later.
	if md, ok := s.dialect.(maintenanceDialect); ok {
		p.localDefault, p.localErr = localTimes(ctx, p.conn, md.maintenanceQueries(s.table, s.config))
		if p.localErr != nil || p.localDefault != "" {
			p.margin = localTimeMargin
		}
	}
	return p, nil, nil
}

// Close releases the purge lock and the connections.
func (p *purgeSession) Close() error {
	var errs []error
	if p.lock != nil {
		if err := p.lock.release(); err != nil {
			errs = append(errs, fmt.Errorf("sqlinbox: releasing the purge lock of %s: %w", p.s.table, err))
		}
		p.lock = nil
	}
	if p.conn != nil {
		errs = append(errs, p.conn.Close())
	}
	return errors.Join(errs...)
}

// checkLock fails when the session lost its purge lock.
func (p *purgeSession) checkLock(ctx context.Context) error {
	if p.lock == nil {
		return nil
	}
	if err := p.lock.check(ctx, p.conn); err != nil {
		return fmt.Errorf("sqlinbox: purge of %s: lost the purge lock, so another purge may run; stopping the round: %w", p.s.table, err)
	}
	return nil
}

// discard closes conn, ending its database session (and any lock it
// holds), instead of returning it to the pool: [driver.ErrBadConn] from
// [sql.Conn.Raw] makes [database/sql] drop the connection.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// DeleteBatch implements [maintenance.PurgeSession].
func (p *purgeSession) DeleteBatch(ctx context.Context, scope maintenance.PurgeScope, limit int, timeout time.Duration) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("sqlinbox: purge batch size must be positive, got %d", limit)
	}
	if err := p.checkLock(ctx); err != nil {
		return 0, err
	}
	release, err := p.hold(ctx)
	if err != nil {
		return 0, err
	}
	defer release()
	scope = widen(scope, p.margin)
	attempt := func() (int64, error) { return p.deleteBatch(ctx, scope, limit, timeout) }
	if p.q.waitForBatch != nil {
		return p.q.waitForBatch(ctx, p.conn, attempt)
	}
	return attempt()
}

func (p *purgeSession) deleteBatch(ctx context.Context, scope maintenance.PurgeScope, limit int, timeout time.Duration) (int64, error) {
	if p.q.selectBatch != nil {
		return p.deleteByKeys(ctx, scope, limit, timeout)
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
	res, err := tx.ExecContext(ctx, p.q.deleteBatch(shapeOf(scope), timeout), scopeArgs(scope, limit)...)
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

// deleteByKeys is a batch of [purgeQueries.selectBatch] and
// [purgeQueries.deleteKeys].
func (p *purgeSession) deleteByKeys(ctx context.Context, scope maintenance.PurgeScope, limit int, timeout time.Duration) (int64, error) {
	rows, err := p.conn.QueryContext(ctx, p.q.selectBatch(shapeOf(scope), timeout), scopeArgs(scope, limit)...)
	if err != nil {
		return 0, p.fail(ctx, "purging", err)
	}
	var order []string // consumers in the order first seen
	ids := map[string][]any{}
	for rows.Next() {
		var consumer, id []byte
		if err := rows.Scan(&consumer, &id); err != nil {
			_ = rows.Close()
			return 0, p.fail(ctx, "purging", err)
		}
		if _, ok := ids[string(consumer)]; !ok {
			order = append(order, string(consumer))
		}
		ids[string(consumer)] = append(ids[string(consumer)], id)
	}
	if err := rows.Err(); err != nil {
		return 0, p.fail(ctx, "purging", err)
	}
	if len(order) == 0 {
		return 0, nil
	}
	args := []any{scope.OlderThan.Microseconds()}
	perConsumer := make([]int, len(order))
	for i, c := range order {
		args = append(args, []byte(c))
		args = append(args, ids[c]...)
		perConsumer[i] = len(ids[c])
	}
	res, err := p.conn.ExecContext(ctx, p.q.deleteKeys(perConsumer, timeout), args...)
	if err != nil {
		return 0, p.fail(ctx, "purging", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, p.fail(ctx, "purging", err)
	}
	return n, nil
}

// hold makes sure the session holds a connection for one batch, and
// returns what gives it back when the session yields it between batches.
func (p *purgeSession) hold(ctx context.Context) (release func(), err error) {
	if !p.yield {
		return func() {}, nil
	}
	if p.conn == nil {
		if p.conn, err = p.s.db.Conn(ctx); err != nil {
			return nil, fmt.Errorf("sqlinbox: purge of %s: %w", p.s.table, err)
		}
	}
	return func() {
		_ = p.conn.Close()
		p.conn = nil
	}, nil
}

// CountExpired implements [maintenance.PurgeSession].
func (p *purgeSession) CountExpired(ctx context.Context, scope maintenance.PurgeScope) (map[string]int64, error) {
	release, err := p.hold(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	scope = widen(scope, p.margin)
	rows, err := p.conn.QueryContext(ctx, p.q.countExpired(shapeOf(scope)), scopeArgs(scope)...)
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
func (p *purgeSession) fail(ctx context.Context, doing string, err error) error {
	if ctx.Err() == nil && p.pd.statementTimedOut(err) {
		return fmt.Errorf("sqlinbox: %s %s: %w: %w", doing, p.s.table, maintenance.ErrPurgeTimeout, err)
	}
	return p.s.maintenanceErr(doing, err)
}
