package inbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// outcomes records the outcome of every message.
type outcomes struct {
	mu   sync.Mutex
	seen []observe.Outcome
}

func (o *outcomes) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(ob observe.Observation) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.seen = append(o.seen, ob.Outcome)
	}
}

// batchOn runs a batch consumer of config on a gochannel topic until the
// test ends; the handler fails every batch holding a message "bad".
func batchOn(t *testing.T, config inbox.BatchConfig, calls *atomic.Int64) *gochannel.GoChannel {
	store, err := sqlinbox.New(testdb.SQLite(t), sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	config.Store, config.Consumer = store, "c"
	consumer, err := inbox.NewBatchConsumer(config, func(_ context.Context, msgs []*message.Message) error {
		calls.Add(1)
		for _, msg := range msgs {
			if string(msg.Payload) == "bad" {
				return errors.New("malformed")
			}
		}
		return nil
	})
	require.NoError(t, err)
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = consumer.Run(ctx, pubsub, "events")
	}()
	t.Cleanup(func() { cancel(); <-done })
	time.Sleep(50 * time.Millisecond) // the subscription
	return pubsub
}

// A message that fails on its own without a PoisonPublisher is nacked after
// a backoff, not at once: a broker hands a nack back at once, and the
// consumer would roll it back in a hot loop. It is logged, once per
// LogInterval.
func TestBatchNackedMessageBacksOffAndIsLogged(t *testing.T) {
	t.Parallel()
	logs := watermill.NewCaptureLogger()
	var calls atomic.Int64
	pubsub := batchOn(t, inbox.BatchConfig{Logger: logs}, &calls)
	require.NoError(t, pubsub.Publish("events", eventMsg("bad-1", "bad")))
	time.Sleep(time.Second)
	// Waits of 100 ms doubling to 2 s, less a fifth: 4 attempts in a second
	// at most (5 allowed),
	// where a nack at once makes hundreds.
	require.LessOrEqual(t, calls.Load(), int64(5), "handler calls in one second")
	require.GreaterOrEqual(t, calls.Load(), int64(1))
	var lines int
	for _, l := range logs.Captured()[watermill.ErrorLogLevel] {
		require.True(t, strings.Contains(l.Msg, "failed on their own"), l.Msg)
		require.ErrorContains(t, l.Err, `"bad-1"`)
		lines++
	}
	require.Equal(t, 1, lines, "one line per LogInterval")
}

// A poisoned message's observation says poisoned.
func TestBatchPoisonedOutcome(t *testing.T) {
	t.Parallel()
	seen := &outcomes{}
	var calls atomic.Int64
	poison := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	pubsub := batchOn(t, inbox.BatchConfig{Observer: seen, PoisonPublisher: poison, PoisonTopic: "poison"}, &calls)
	require.NoError(t, pubsub.Publish("events", eventMsg("bad-1", "bad")))
	require.Eventually(t, func() bool {
		seen.mu.Lock()
		defer seen.mu.Unlock()
		return len(seen.seen) == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []observe.Outcome{observe.Poisoned}, seen.seen)
}

// A transient failure is retried in place after a backoff, with one line
// when it starts and one when it ends.
func TestBatchTransientFailureWaitedOut(t *testing.T) {
	t.Parallel()
	logs := watermill.NewCaptureLogger()
	store, err := sqlinbox.New(testdb.SQLite(t), sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	var calls atomic.Int64
	consumer, err := inbox.NewBatchConsumer(inbox.BatchConfig{Store: store, Consumer: "c", Logger: logs, Backoff: inbox.BackoffConfig{InitialInterval: time.Millisecond}},
		func(context.Context, []*message.Message) error {
			if calls.Add(1) <= 2 {
				return inbox.Transient(errors.New("database restarting"))
			}
			return nil
		})
	require.NoError(t, err)
	msgs := []*message.Message{eventMsg("e-1", "{}"), eventMsg("e-2", "{}")}
	require.NoError(t, consumer.Process(context.Background(), msgs))
	require.EqualValues(t, 3, calls.Load())
	for _, msg := range msgs {
		select {
		case <-msg.Acked():
		default:
			t.Fatal("not acked")
		}
	}
	captured := logs.Captured()
	require.Len(t, captured[watermill.ErrorLogLevel], 1)
	require.Contains(t, captured[watermill.ErrorLogLevel][0].Msg, "transient failures")
	require.Len(t, captured[watermill.InfoLogLevel], 1)
	require.Equal(t, "Inbox: transient failures over", captured[watermill.InfoLogLevel][0].Msg)
}

// A batch consumer of consumer "billing" in another service than the
// middleware of "billing" on the same table warns, as a middleware would:
// each event runs in only one of them.
func TestBatchConsumerWarnsOfSharedConsumer(t *testing.T) {
	t.Parallel()
	store, err := sqlinbox.New(testdb.SQLite(t), sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "billing", Service: "billing"})
	require.NoError(t, err)
	_, err = mw(func(msg *message.Message) ([]*message.Message, error) {
		inbox.TxNotNeeded(msg.Context())
		return nil, nil
	})(eventMsg("e-1", "{}"))
	require.NoError(t, err)

	logs := watermill.NewCaptureLogger()
	consumer, err := inbox.NewBatchConsumer(inbox.BatchConfig{Store: store, Consumer: "billing", Logger: logs}, func(ctx context.Context, _ []*message.Message) error {
		inbox.TxNotNeeded(ctx)
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, consumer.Process(context.Background(), []*message.Message{eventMsg("e-2", "{}"), eventMsg("e-3", "{}")}))
	var warned int
	for _, lines := range logs.Captured() {
		for _, l := range lines {
			if strings.Contains(l.Msg, `shares consumer "billing"`) {
				warned++
			}
		}
	}
	require.Equal(t, 1, warned, "one warning per consumer")
}
