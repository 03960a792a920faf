package pgxinbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

var (
	_ inboxdriver.TxProber = (*Store)(nil)
	_ inboxdriver.DBProber = (*Store)(nil)
)

// ProbeTx implements [inboxdriver.TxProber] as [sqlinbox.Store.ProbeTx]
// does, with SELECT 1 on the claim's pgx transaction: nil when PostgreSQL
// answered, with a row or an error of its own that is not
// [Store.IsUnavailable]'s (25P02 after a failed statement).
func (s *Store) ProbeTx(ctx context.Context, tx inboxdriver.Tx) error {
	t, ok := tx.Handle().(pgx.Tx)
	if !ok {
		return nil
	}
	_, err := t.Exec(ctx, "SELECT 1")
	if err == nil || errors.Is(err, pgx.ErrTxClosed) || s.answered(err) {
		return nil
	}
	return err
}

// ProbeDB implements [inboxdriver.DBProber] as [sqlinbox.Store.ProbeDB]
// does, with SELECT 1 on a connection of the pool.
func (s *Store) ProbeDB(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, "SELECT 1")
	if err == nil || s.answered(err) {
		return nil
	}
	return err
}

// IsCancelled implements [inboxdriver.DBProber] as
// [sqlinbox.Store.IsCancelled] does.
func (s *Store) IsCancelled(err error) bool { return s.sql.IsCancelled(err) }

// answered reports whether err is PostgreSQL's own, other than one saying
// it or the connection is going away.
func (s *Store) answered(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && !s.IsUnavailable(err)
}
