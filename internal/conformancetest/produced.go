package conformancetest

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/observe"
)

// txPublisher holds the inbox transaction, as a watermill-sql publisher
// built on it does, and writes each message with write.
type txPublisher struct {
	tx    inboxdriver.Tx
	write func(payload string) error
}

func (p txPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if err := p.write(string(m.Payload)); err != nil {
			return err
		}
	}
	return nil
}

func (txPublisher) Close() error { return nil }

// funcPublisher writes each message with a closure, where the middleware
// cannot see what it writes through.
type funcPublisher func(payload string) error

func (p funcPublisher) Publish(_ string, msgs ...*message.Message) error {
	return txPublisher{write: p}.Publish("", msgs...)
}

func (funcPublisher) Close() error { return nil }

// dbPublisher writes through the connection pool, as a watermill-sql
// publisher built on the *sql.DB does: its rows commit on their own.
type dbPublisher struct {
	db     *sql.DB
	insert string
}

func (p dbPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if _, err := p.db.Exec(p.insert, string(m.Payload)); err != nil {
			return err
		}
	}
	return nil
}

func (dbPublisher) Close() error { return nil }

// The publisher inbox.Config.ProducedPublisher builds must write through
// the inbox transaction. One that holds it, or writes through it from a
// closure, commits the produced messages with the claim. One that holds
// the connection pool is refused before it writes anything; one whose
// writes the middleware cannot see is caught by the transaction's write
// count: its first messages have gone elsewhere, and it is refused from
// then on. Refused messages roll back, effect and claim.
func testProducedPublisherTx(t *testing.T, target Target) {
	for _, tc := range []struct {
		name      string
		publisher func(b *bundle, ctx context.Context, insert string, elsewhere *atomic.Int64) message.Publisher
		refused   bool
		outbox    int   // rows in the outbox table
		elsewhere int64 // messages published where the inbox transaction is not
	}{
		{"holds the transaction", func(b *bundle, ctx context.Context, insert string, _ *atomic.Int64) message.Publisher {
			tx, _ := inbox.StoreTxFromContext(ctx)
			return txPublisher{tx: tx, write: func(payload string) error { return b.exec(ctx, insert, payload) }}
		}, false, 4, 0},
		{"writes through the transaction from a closure", func(b *bundle, ctx context.Context, insert string, _ *atomic.Int64) message.Publisher {
			return funcPublisher(func(payload string) error { return b.exec(ctx, insert, payload) })
		}, false, 4, 0},
		{"holds the connection pool", func(b *bundle, _ context.Context, insert string, _ *atomic.Int64) message.Publisher {
			return dbPublisher{db: b.db, insert: insert}
		}, true, 0, 0},
		{"publishes where the middleware cannot see", func(_ *bundle, _ context.Context, _ string, elsewhere *atomic.Int64) message.Publisher {
			return funcPublisher(func(string) error { elsewhere.Add(1); return nil })
		}, true, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, target)
			outbox := b.table(t, "outbox", "payload")
			insert := fmt.Sprintf(`INSERT INTO %s (payload) VALUES (%s)`, outbox, b.target.Placeholder(1))
			var elsewhere atomic.Int64
			last := &lastObservation{}
			mw := b.middleware(t, inbox.Config{
				Observer: last,
				ProducedPublisher: func(ctx context.Context) (message.Publisher, error) {
					return tc.publisher(b, ctx, insert, &elsewhere), nil
				},
			})
			results := firstResults(t, mw, func(msg *message.Message) ([]*message.Message, error) {
				if err := b.writeEffect(msg); err != nil {
					return nil, err
				}
				id, _, _ := inbox.EventIDFromContext(msg.Context())
				return []*message.Message{
					message.NewMessage(watermill.NewUUID(), []byte(id+"/1")),
					message.NewMessage(watermill.NewUUID(), []byte(id+"/2")),
				}, nil
			}, newMsg("a"), newMsg("b"))
			for i, err := range results {
				if !tc.refused {
					require.NoError(t, err)
					continue
				}
				require.ErrorIs(t, err, inbox.ErrMiswired, "delivery %d", i+1)
				require.ErrorContains(t, err, "inbox.TxFromContext(ctx)", "the error says how to build it")
			}
			require.Equal(t, tc.outbox, b.count(t, outbox))
			require.Equal(t, tc.elsewhere, elsewhere.Load(), "the first batch only: the second delivery is refused before it publishes")
			if tc.refused {
				require.Empty(t, b.effectCounts(t))
				require.Zero(t, b.claims(t))
				require.Equal(t, observe.Miswired, last.ob.Outcome)
				return
			}
			require.Equal(t, once("billing", "a", "b"), b.effectCounts(t))
		})
	}
}

// firstResults delivers each message once through a router, to a handler
// named "billing" that publishes to "out", behind mw, and returns mw's
// result for each. The results are acked, failures included, so that a
// refused message is not redelivered.
func firstResults(t *testing.T, mw message.HandlerMiddleware, h message.HandlerFunc, msgs ...*message.Message) []error {
	t.Helper()
	ps := pubsub()
	var (
		mu      sync.Mutex
		results = map[string]error{}
	)
	RunRouter(t, func(r *message.Router) {
		r.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				_, err := next(msg)
				mu.Lock()
				results[msg.UUID] = err
				mu.Unlock()
				return nil, nil
			}
		}, mw)
		r.AddHandler("billing", "events", ps, "out", ps, h)
	})
	out := make([]error, len(msgs))
	for i, m := range msgs {
		PublishWithin(t, ps, "events", m)
		mu.Lock()
		out[i] = results[m.UUID]
		mu.Unlock()
	}
	return out
}
