package watermillsql_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/wsqltest"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// pgxRig is a watermill-sql v4 topic on PostgreSQL with pgxinbox's
// middleware on its inbox table.
func pgxRig(t *testing.T) (*wsqltest.Rig, *pgxpool.Pool, message.HandlerMiddleware) {
	t.Helper()
	r := wsqltest.New(t, wsqltest.Flavour{Version: 4})
	pool, err := pgxpool.New(context.Background(), r.DSN)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{Table: r.Inbox})
	require.NoError(t, err)
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	require.NoError(t, err)
	return r, pool, mw
}

// A watermill-sql v4 subscriber on pgx hands each message over inside a pgx
// transaction of its own; behind pgxinbox the claim's transaction stands in
// for it, so the handler's writes through watermill-sql's TxFromContext
// commit with the claim, and a failed attempt rolls back with it.
func TestPgxSubscriberTxStandIn(t *testing.T) {
	t.Parallel()
	r, pool, mw := pgxRig(t)
	ids := r.PublishCopies(t, 5, 2)
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), r.V4Config(wsqltest.WaitFor), nil)
	require.NoError(t, err)

	var failed atomic.Bool
	handler := func(msg *message.Message) error {
		ctx := msg.Context()
		wtx, ok := wsql.TxFromContext(ctx)
		if !ok {
			return errors.New("watermill-sql's TxFromContext found no transaction")
		}
		ptx, ok := pgxinbox.TxFromContext(ctx)
		if !ok || wtx.(*wsql.PgxTx).Tx != ptx {
			return errors.New("the accessors return different transactions")
		}
		if _, err := wtx.ExecContext(ctx, `UPDATE `+r.Counter+` SET value = value + 1 WHERE id = 1`); err != nil {
			return err
		}
		if _, err := wtx.ExecContext(ctx, `INSERT INTO `+r.Effects+` (event_id) VALUES ($1)`, msg.UUID); err != nil {
			return err
		}
		if msg.UUID == ids[1] && failed.CompareAndSwap(false, true) {
			return errors.New("the first attempt fails after writing")
		}
		return nil
	}
	stop := wsqltest.RunRouter(t, sub, r.Topic, handler, mw)
	r.WaitDrained(t)
	stop()
	require.True(t, failed.Load())
	require.Equal(t, wsqltest.Exactly(5), r.Outcome(t))
}

// A pgx transaction cannot stand in for a database/sql one: the claim is
// rolled back and the message refused before the handler runs, with an
// error that says what to do.
func TestPgxSubscriberTxRefused(t *testing.T) {
	t.Parallel()
	r, _, mw := pgxRig(t)
	r.PublishCopies(t, 1, 1)
	calls, got := wsqltest.FirstResult(t, r.Subscriber(t), r.Topic, mw)
	require.ErrorIs(t, got, inbox.ErrSubscriberTx)
	require.True(t, inbox.IsPermanent(got), "no redelivery can help: %v", got)
	require.False(t, inbox.IsTransient(got), "%v", got)
	require.ErrorContains(t, got, "sqlinbox store")
	require.Zero(t, calls, "the handler did not run")
	require.Equal(t, wsqltest.Outcome{}, r.Outcome(t))
}
