package sqlinbox

import (
	"context"
	"database/sql"
	"errors"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

var (
	_ inboxdriver.TxProber = (*Store)(nil)
	_ inboxdriver.DBProber = (*Store)(nil)
)

// probeSQL asks nothing of any table; every dialect answers it.
const probeSQL = `SELECT 1`

// ProbeTx implements [inboxdriver.TxProber]: it runs SELECT 1 on the
// claim's transaction after a handler failed, so that the middleware calls
// the failure an outage only on evidence that the claim's own connection
// went away, never by the Go type of the handler's error (an io.EOF from
// decoding a truncated payload looks like a closed socket).
//
// It returns nil when the database answered: a row, or an error carrying
// its code that is not one of [Store.IsUnavailable]'s (PostgreSQL's 25P02
// after a failed statement). A transaction the handler ended itself tells
// nothing about the connection, and is nil too. Otherwise the error shows
// the connection did not answer: a broken connection, a driver's
// [driver.ErrBadConn], ctx's deadline.
//
// [driver.ErrBadConn]: https://pkg.go.dev/database/sql/driver#ErrBadConn
func (s *Store) ProbeTx(ctx context.Context, tx inboxdriver.Tx) error {
	t, ok := tx.Handle().(*sql.Tx)
	if !ok {
		return nil
	}
	var one int
	err := t.QueryRowContext(ctx, probeSQL).Scan(&one)
	if err == nil || errors.Is(err, sql.ErrTxDone) || s.answered(err) {
		return nil
	}
	return err
}

// ProbeDB implements [inboxdriver.DBProber]: it runs SELECT 1 on a
// connection of the pool, after a handler's cancelled statement took the
// claim's connection with it, so that the middleware calls the handler's
// own timeout its error, and an outage one only when the database does not
// answer here either. nil means an answer, as for [Store.ProbeTx].
func (s *Store) ProbeDB(ctx context.Context) error {
	var one int
	err := s.db.QueryRowContext(ctx, probeSQL).Scan(&one)
	if err == nil || s.answered(err) {
		return nil
	}
	return err
}

// answered reports whether err carries the database's own code, other than
// one saying it or the connection is going away.
func (s *Store) answered(err error) bool {
	if s.IsUnavailable(err) {
		return false
	}
	var sqlite sqliteCoder
	_, mysql := mysqlErrorNumber(err)
	return pgCode(err) != "" || mysql || errors.As(err, &sqlite)
}
