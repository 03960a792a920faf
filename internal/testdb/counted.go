package testdb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// Statements counts the statements sent through a pool [Counted] opened
// whose text contains a string, failed ones included: the count a server
// log with every statement would give, for a test that cannot read the
// server's log.
type Statements struct {
	match string
	n     atomic.Int64
}

// Count returns the statements counted so far.
func (s *Statements) Count() int64 { return s.n.Load() }

func (s *Statements) see(query string) {
	if strings.Contains(query, s.match) {
		s.n.Add(1)
	}
}

// Counted opens driverName on dsn as [Open] does, through a wrapper of the
// real driver that counts the statements whose text contains match.
func Counted(t testing.TB, driverName, dsn, match string) (*sql.DB, *Statements) {
	t.Helper()
	probe, err := sql.Open(driverName, dsn)
	require.NoError(t, err)
	drv := probe.Driver()
	require.NoError(t, probe.Close())
	var inner driver.Connector = dsnConnector{drv, dsn}
	if dc, ok := drv.(driver.DriverContext); ok {
		inner, err = dc.OpenConnector(dsn)
		require.NoError(t, err)
	}
	st := &Statements{match: match}
	db := sql.OpenDB(countingConnector{inner, st})
	opened.Store(db, source{driverName, dsn})
	t.Cleanup(func() {
		_ = db.Close()
		opened.Delete(db)
	})
	require.NoError(t, db.Ping(), "no database answers at %s (run ./test.sh, which starts one)", dsn)
	return db, st
}

type dsnConnector struct {
	drv driver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.drv }

type countingConnector struct {
	inner driver.Connector
	st    *Statements
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{conn, c.st}, nil
}

// Driver is the real driver, so that a store recognises it.
func (c countingConnector) Driver() driver.Driver { return c.inner.Driver() }

// countingConn passes every call on to the real connection; a query sent
// directly is counted unless the driver declines it (driver.ErrSkip: then
// database/sql prepares it, and the statement counts it).
type countingConn struct {
	driver.Conn
	st *Statements
}

func (c *countingConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	var s driver.Stmt
	var err error
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		s, err = p.PrepareContext(ctx, query)
	} else {
		s, err = c.Conn.Prepare(query)
	}
	if err != nil {
		c.st.see(query) // sent, and refused
		return nil, err
	}
	return &countingStmt{Stmt: s, query: query, st: c.st}, nil
}

func (c *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		return b.BeginTx(ctx, opts)
	}
	//lint:ignore SA1019 the driver has nothing newer
	return c.Conn.Begin()
}

func (c *countingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	return sent[driver.Result](c.st, query)(e.ExecContext(ctx, query, args))
}

func (c *countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := c.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	return sent[driver.Rows](c.st, query)(q.QueryContext(ctx, query, args))
}

// sent counts query once the driver took it, and passes its result on.
func sent[R any](st *Statements, query string) func(R, error) (R, error) {
	return func(r R, err error) (R, error) {
		if err != driver.ErrSkip {
			st.see(query)
		}
		return r, err
	}
}

func (c *countingConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *countingConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *countingConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *countingConn) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := c.Conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

type countingStmt struct {
	driver.Stmt
	query string
	st    *Statements
}

func (s *countingStmt) Exec(args []driver.Value) (driver.Result, error) {
	s.st.see(s.query)
	//lint:ignore SA1019 database/sql calls it only for a driver without StmtExecContext
	return s.Stmt.Exec(args)
}

func (s *countingStmt) Query(args []driver.Value) (driver.Rows, error) {
	s.st.see(s.query)
	//lint:ignore SA1019 database/sql calls it only for a driver without StmtQueryContext
	return s.Stmt.Query(args)
}

func (s *countingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if e, ok := s.Stmt.(driver.StmtExecContext); ok {
		s.st.see(s.query)
		return e.ExecContext(ctx, args)
	}
	return s.Exec(values(args))
}

func (s *countingStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := s.Stmt.(driver.StmtQueryContext); ok {
		s.st.see(s.query)
		return q.QueryContext(ctx, args)
	}
	return s.Query(values(args))
}

func values(args []driver.NamedValue) []driver.Value {
	v := make([]driver.Value, len(args))
	for i, a := range args {
		v[i] = a.Value
	}
	return v
}

func (s *countingStmt) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}
