package pgxinbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

var _ inboxdriver.TxProber = (*Store)(nil)

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
	var pgErr *pgconn.PgError
	if err == nil || errors.Is(err, pgx.ErrTxClosed) || errors.As(err, &pgErr) && !s.IsUnavailable(err) {
		return nil
	}
	return err
}
