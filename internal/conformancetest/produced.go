package conformancetest

import (
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// funcPublisher writes each message with a closure, where the middleware
// cannot see what it writes through.
type funcPublisher func(payload string) error

func (p funcPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if err := p(string(m.Payload)); err != nil {
			return err
		}
	}
	return nil
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

// The produced publisher is built on the claim's transaction
// (inbox.PublishInTx hands it over), so the right one is the obvious one.
// One that writes through it commits the produced messages with the
// claim. One whose rows the transaction did not write (a publisher on the
// connection pool, a broker's) is only suspected: the message is processed
// and one warning is logged (observe.PublisherOutsideTx). A watermill-sql
// publisher on the pool, which is proof, is refused: the test rig's
// watermillsql package runs it.
func testProducedPublisherTx(t *testing.T, target Target) {
	for _, tc := range []struct {
		name      string
		publisher func(b *bundle, tx *sql.Tx, insert string, elsewhere *atomic.Int64) message.Publisher
		warned    bool
		outbox    int   // rows in the outbox table
		elsewhere int64 // messages published where the inbox transaction is not
	}{
		{"writes through the transaction", func(b *bundle, tx *sql.Tx, insert string, _ *atomic.Int64) message.Publisher {
			return funcPublisher(func(payload string) error { _, err := tx.Exec(insert, payload); return err })
		}, false, 4, 0},
		{"writes through the connection pool", func(b *bundle, _ *sql.Tx, insert string, _ *atomic.Int64) message.Publisher {
			return dbPublisher{db: b.db, insert: insert}
		}, true, 4, 0},
		{"publishes where the middleware cannot see", func(_ *bundle, _ *sql.Tx, _ string, elsewhere *atomic.Int64) message.Publisher {
			return funcPublisher(func(string) error { elsewhere.Add(1); return nil })
		}, true, 0, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, target)
			if b.target.Native != nil {
				t.Skip("a native pgx store hands out a pgx.Tx: pgxinbox's own tests cover pgxinbox.PublishInTx")
			}
			if tc.name == "writes through the connection pool" && b.target.Dialect == sqlinbox.SQLite {
				t.Skip("SQLite has one writer: a write through the pool waits for the claim's own lock and fails busy")
			}
			outbox := b.table(t, "outbox", "payload")
			insert := fmt.Sprintf(`INSERT INTO %s (payload) VALUES (%s)`, outbox, b.target.Placeholder(1))
			var elsewhere atomic.Int64
			warnings := &outcomes{}
			logger := NewLogger()
			mw := b.middleware(t, inbox.Config{
				Observer: warnings,
				Logger:   logger,
				ProducedPublisher: inbox.PublishInTx(func(tx *sql.Tx) (message.Publisher, error) {
					return tc.publisher(b, tx, insert, &elsewhere), nil
				}),
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
			for _, err := range results {
				require.NoError(t, err, "a suspicion never refuses a message")
			}
			require.Equal(t, tc.outbox, b.count(t, outbox))
			require.Equal(t, tc.elsewhere, elsewhere.Load())
			require.Equal(t, once("billing", "a", "b"), b.effectCounts(t))
			logs := logger.Warnings()
			if !tc.warned || b.target.TransactionPooling { // behind a pooler the count cannot tell
				require.Empty(t, logs)
				return
			}
			require.Len(t, logs, 1, "one warning per consumer")
			require.Equal(t, string(observe.PublisherOutsideTx), logs[0].Fields["warning"])
			require.Equal(t, 1, warnings.warned(observe.PublisherOutsideTx), "the first publish is the one counted")
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
