package watermillsql_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	wsqlv3 "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/internal/testing/wsqltest"
	"github.com/watermill-inbox/inbox/observe"
)

// A produced publisher on watermill-sql's DefaultMySQLSchema (v3 or v4,
// bare or behind Watermill's forwarder) is warned about, once per
// consumer, on every message it publishes: that schema's relay skips rows
// that commit below an offset it acked (docs/outbox.md). v4's queue schema,
// whose relay skips none, is not. The messages are processed either way.
func TestSkippingRelayWarning(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		version int
		build   func(tx *sql.Tx, topic string) (message.Publisher, error)
		warned  bool
	}{
		{"v3 DefaultMySQLSchema", 3, func(tx *sql.Tx, topic string) (message.Publisher, error) {
			return wsqlv3.NewPublisher(tx, wsqlv3.PublisherConfig{SchemaAdapter: wsqlv3.DefaultMySQLSchema{}}, nil)
		}, true},
		{"v4 DefaultMySQLSchema", 4, func(tx *sql.Tx, topic string) (message.Publisher, error) {
			return wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultMySQLSchema{}}, nil)
		}, true},
		{"v4 DefaultMySQLSchema behind the forwarder", 4, func(tx *sql.Tx, topic string) (message.Publisher, error) {
			pub, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultMySQLSchema{}}, nil)
			return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: topic}), err
		}, true},
		{"v4 MySQLQueueSchema", 4, func(tx *sql.Tx, topic string) (message.Publisher, error) {
			return wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.MySQLQueueSchema{}}, nil)
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := wsqltest.New(t, wsqltest.Flavour{Version: c.version, MySQL: true})
			logger := conformancetest.NewLogger()
			warnings := &warningsSeen{}
			mw, err := inbox.NewMiddleware(inbox.Config{
				Store:             r.Store(t),
				Logger:            logger,
				ProducedPublisher: inbox.PublishInTx(func(tx *sql.Tx) (message.Publisher, error) { return c.build(tx, r.Topic) }),
				Observer:          warnings,
			})
			require.NoError(t, err)
			ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
			conformancetest.RunRouter(t, func(router *message.Router) {
				router.AddHandler("billing", "orders", ps, r.Topic, effects.DiscardPublisher{}, inbox.Handler(mw,
					func(msg *message.Message) ([]*message.Message, error) {
						tx, _ := inbox.TxFromContext(msg.Context())
						if err := r.Count(msg.Context(), tx, msg.UUID); err != nil {
							return nil, err
						}
						return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{}`))}, nil
					}))
			})
			for range 2 {
				conformancetest.PublishWithin(t, ps, "orders", message.NewMessage(watermill.NewUUID(), []byte(`{}`)))
			}
			require.Equal(t, wsqltest.Exactly(2), r.Outcome(t))
			require.Equal(t, 2, r.Rows(t))
			require.Empty(t, logger.Errors(), "a suspicion is not an error")
			logs := logger.Warnings()
			if !c.warned {
				require.Empty(t, logs)
				require.Equal(t, []observe.Warning{"", ""}, warnings.all())
				return
			}
			require.Len(t, logs, 1, "logged once per consumer")
			require.Equal(t, string(observe.SkippingRelay), logs[0].Fields["warning"])
			require.Contains(t, logs[0].Msg, "MySQLQueueSchema")
			require.Equal(t, []observe.Warning{observe.SkippingRelay, observe.SkippingRelay}, warnings.all())
		})
	}
}

// warningsSeen records the warning of every message, in order.
type warningsSeen struct {
	mu   sync.Mutex
	seen []observe.Warning
}

func (w *warningsSeen) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(o observe.Observation) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.seen = append(w.seen, o.Warning)
	}
}

func (w *warningsSeen) all() []observe.Warning {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]observe.Warning(nil), w.seen...)
}
