package watermillsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/wsqltest"
)

func middlewareFor(t testing.TB, r *wsqltest.Rig) message.HandlerMiddleware {
	mw, err := inbox.NewMiddleware(inbox.Config{Store: r.Store(t)})
	require.NoError(t, err)
	return mw
}

// attempts counts handler calls per event, from any goroutine.
type attempts struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *attempts) add(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n = map[string]int{}
	}
	a.n[id]++
	return a.n[id]
}

func (a *attempts) of(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[id]
}

// A handler behind the inbox, on a watermill-sql subscriber, finds the same
// transaction through watermill-sql's TxFromContext and the inbox's, and
// writes through either commit with the claim. A handler error rolls them
// back; watermill-sql resends the message inside its same transaction, and
// the resend is applied once.
func TestSubscriberTxStandIn(t *testing.T) {
	t.Parallel()
	wsqltest.EachFlavour(t, func(t *testing.T, r *wsqltest.Rig) {
		ids := r.PublishCopies(t, 6, 2)
		failing := ids[2]

		// Outside the inbox: the subscriber's own transaction of each
		// delivery of the failing event.
		var mu sync.Mutex
		var outerTxs []*sql.Tx
		recordOuter := func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				if msg.UUID == failing {
					tx, _ := r.SubscriberTx(msg.Context())
					mu.Lock()
					outerTxs = append(outerTxs, tx)
					mu.Unlock()
				}
				return h(msg)
			}
		}
		var calls attempts
		handler := func(msg *message.Message) error {
			n := calls.add(msg.UUID)
			wtx, ok := r.SubscriberTx(msg.Context())
			if !ok {
				return errors.New("watermill-sql's TxFromContext found no transaction")
			}
			itx, ok := inbox.TxFromContext(msg.Context())
			if !ok || itx != wtx {
				return fmt.Errorf("the accessors return different transactions: %p and %p", wtx, itx)
			}
			tx := wtx
			if n%2 == 0 {
				tx = itx
			}
			if err := r.Count(msg.Context(), tx, msg.UUID); err != nil {
				return err
			}
			if msg.UUID == failing && n == 1 {
				return errors.New("the first attempt fails after writing")
			}
			return nil
		}
		stop := wsqltest.RunRouter(t, r.Subscriber(t), r.Topic, handler, recordOuter, middlewareFor(t, r))
		r.WaitDrained(t)
		stop()

		require.Equal(t, wsqltest.Exactly(6), r.Outcome(t))
		require.Equal(t, 2, calls.of(failing), "the failed attempt and its resend")
		for _, id := range ids {
			if id != failing {
				require.Equal(t, 1, calls.of(id), "the second copy is a duplicate")
			}
		}
		mu.Lock()
		defer mu.Unlock()
		require.GreaterOrEqual(t, len(outerTxs), 3, "two deliveries of the first copy, one of the second")
		require.NotNil(t, outerTxs[0])
		require.Same(t, outerTxs[0], outerTxs[1], "watermill-sql resent the nacked message in its same transaction")
	})
}

// watermill-sql commits its transaction when it stops waiting for the ack
// (AckDeadline here; a closing subscriber too), even while the handler is
// still writing in it: the reason the claim does not join that transaction.
// The handler's first write, made before, is not committed with it, since
// it went to the inbox's transaction; the redelivery is processed once,
// whole.
func TestSubscriberGivesUpMidHandler(t *testing.T) {
	t.Parallel()
	wsqltest.EachFlavour(t, func(t *testing.T, r *wsqltest.Rig) {
		ids := r.PublishCopies(t, 1, 1)
		sub, err := r.SubscriberWith(500 * time.Millisecond)
		require.NoError(t, err)

		// The subscriber's transaction of the first delivery. The
		// second one comes while the first handler is still running.
		var outer *sql.Tx
		var once sync.Once
		recordOuter := func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				once.Do(func() { outer, _ = r.SubscriberTx(msg.Context()) })
				return h(msg)
			}
		}
		var calls attempts
		var gaveUp bool
		handler := func(msg *message.Message) error {
			tx, _ := r.SubscriberTx(msg.Context())
			ctx := context.Background()
			if _, err := tx.ExecContext(ctx, `UPDATE `+r.Counter+` SET value = value + 1`); err != nil {
				return err
			}
			if calls.add(msg.UUID) == 1 {
				// Wait until the subscriber has ended its transaction.
				deadline := time.Now().Add(wsqltest.WaitFor)
				for !gaveUp && time.Now().Before(deadline) {
					time.Sleep(wsqltest.Poll)
					_, err := outer.ExecContext(ctx, `SELECT 1`)
					gaveUp = errors.Is(err, sql.ErrTxDone)
				}
			}
			_, err := tx.ExecContext(ctx, r.Rebind(`INSERT INTO `+r.Effects+` (event_id) VALUES (?)`), msg.UUID)
			return err
		}
		stop := wsqltest.RunRouter(t, sub, r.Topic, handler, recordOuter, middlewareFor(t, r))
		r.WaitDrained(t)
		stop()

		require.True(t, gaveUp, "watermill-sql ended its transaction while the handler ran")
		// Each attempt adds one to the counter before it writes the effect;
		// a slow machine may give up on more than the first.
		require.GreaterOrEqual(t, calls.of(ids[0]), 2, "the first attempt was undone, a redelivery processed")
		require.Equal(t, wsqltest.Exactly(1), r.Outcome(t))
	})
}

// A pgx transaction cannot stand in for database/sql's: the message is
// refused before any SQL, with an error that says what to do, and the
// handler does not run.
func TestSubscriberTxRefused(t *testing.T) {
	t.Parallel()
	r := wsqltest.New(t, wsqltest.Flavour{Version: 4})
	r.PublishCopies(t, 1, 1)
	pool, err := pgxpool.New(context.Background(), r.DSN)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), r.V4Config(wsqltest.WaitFor), nil)
	require.NoError(t, err)

	calls, got := wsqltest.FirstResult(t, sub, r.Topic, middlewareFor(t, r))
	require.ErrorIs(t, got, inbox.ErrSubscriberTx)
	require.True(t, inbox.IsPermanent(got), "no redelivery can help: %v", got)
	require.False(t, inbox.IsTransient(got), "%v", got)
	require.ErrorContains(t, got, "pgxinbox store")
	require.Zero(t, calls, "the handler did not run")
	require.Equal(t, wsqltest.Outcome{}, r.Outcome(t))
	require.False(t, r.Drained(t), "the message was not acked")
}
