package brokers_test

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/internal/testing/killtest"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// durable is the JetStream durable consumer (and queue group) every NATS
// test consumes with.
const durable = "billing"

// natsOptions reconnect fast and forever: the cluster test kills the node a
// client is connected to.
func natsOptions() []nats.Option {
	return []nats.Option{nats.ReconnectWait(50 * time.Millisecond), nats.MaxReconnects(-1), nats.Timeout(2 * time.Second)}
}

func natsConnect(t *testing.T, urls string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(urls, natsOptions()...)
	require.NoError(t, err, "no NATS answers at %s (run ./test.sh, which starts one with JetStream)", urls)
	t.Cleanup(nc.Close)
	return nc
}

// natsStream creates a stream with a unique name holding the subject of the
// same name (watermill-nats's default subject for a topic), with replicas
// copies, and deletes it at the end.
func natsStream(t *testing.T, urls string, replicas int) string {
	t.Helper()
	name := testdb.Name("orders")
	js, err := natsConnect(t, urls).JetStream()
	require.NoError(t, err)
	// A cluster answers once it has elected its meta leader.
	require.Eventually(t, func() bool {
		_, err := js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{name}, Replicas: replicas})
		return err == nil
	}, effects.WaitFor, 100*time.Millisecond, "JetStream at %s did not create the stream", urls)
	t.Cleanup(func() {
		if nc, err := nats.Connect(urls); err == nil {
			if js, err := nc.JetStream(); err == nil {
				_ = js.DeleteStream(name)
			}
			nc.Close()
		}
	})
	return name
}

// natsJetStream is watermill-nats's JetStream configuration for the tests.
// ManualAck matters: without it nats.go acks every message when
// watermill-nats's callback returns, and that callback also returns when
// its AckWaitTimeout expires or the subscriber closes, with the handler
// still running: a message whose transaction then rolls back is lost.
func natsJetStream(ackWait time.Duration) wmnats.JetStreamConfig {
	return wmnats.JetStreamConfig{
		// A publish to a stream whose leader just died fails after a second
		// instead of five, and the producer retries.
		ConnectOptions:   []nats.JSOpt{nats.MaxWait(time.Second)},
		DurablePrefix:    durable,
		SubscribeOptions: []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit(), nats.ManualAck(), nats.AckWait(ackWait)},
	}
}

func natsPublisher(t *testing.T, urls string) *wmnats.Publisher {
	t.Helper()
	pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{URL: urls, NatsOptions: natsOptions(), JetStream: natsJetStream(0)}, logger)
	require.NoError(t, err, "no NATS answers at %s (run ./test.sh, which starts one with JetStream)", urls)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// natsSubscriber runs subscriptions in the durable's queue group; JetStream
// redelivers what is not acked within ackWait.
func natsSubscriber(t testing.TB, urls string, ackWait time.Duration, subscriptions int) message.Subscriber {
	t.Helper()
	sub, err := newCloseSafeSubscriber(natsSubscriberConfig(urls, ackWait, subscriptions))
	require.NoError(t, err, "no NATS answers at %s (run ./test.sh, which starts one with JetStream)", urls)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func natsSubscriberConfig(urls string, ackWait time.Duration, subscriptions int) wmnats.SubscriberConfig {
	return wmnats.SubscriberConfig{
		URL:              urls,
		NatsOptions:      natsOptions(),
		QueueGroupPrefix: durable,
		SubscribersCount: subscriptions,
		AckWaitTimeout:   effects.WaitFor, // watermill-nats's own wait for the handler
		CloseTimeout:     10 * time.Second,
		Unmarshaler:      deliveryCounting{},
		JetStream:        natsJetStream(ackWait),
	}
}

// numDeliveredKey carries JetStream's delivery count of a message.
const numDeliveredKey = "test_nats_num_delivered"

// deliveryCounting is watermill-nats's default unmarshaler that also copies
// JetStream's delivery count into the metadata.
type deliveryCounting struct{}

func (deliveryCounting) Unmarshal(m *nats.Msg) (*message.Message, error) {
	msg, err := (&wmnats.NATSMarshaler{}).Unmarshal(m)
	if err != nil {
		return nil, err
	}
	if md, err := m.Metadata(); err == nil {
		msg.Metadata.Set(numDeliveredKey, strconv.FormatUint(md.NumDelivered, 10))
	}
	return msg, nil
}

func natsRedelivered(msg *message.Message) bool {
	n, _ := strconv.Atoi(msg.Metadata.Get(numDeliveredKey))
	return n > 1
}

// natsDrained waits until the durable has no message left to deliver or to
// be acked.
func natsDrained(t *testing.T, urls, stream string) {
	t.Helper()
	js, err := natsConnect(t, urls).JetStream()
	require.NoError(t, err)
	var last *nats.ConsumerInfo
	require.Eventually(t, func() bool {
		info, err := js.ConsumerInfo(stream, durable)
		if err != nil {
			return false // a cluster electing a leader
		}
		last = info
		return info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0
	}, effects.WaitFor, 50*time.Millisecond, "durable %s of %s not drained: %+v", durable, stream, last)
}

// A handler slower than AckWait: JetStream redelivers the message while the
// first copy still holds its transaction. The copy's claim waits behind it
// (in-flight wait) and finds the claim committed, or, with ClaimTimeout,
// gives up with ErrInFlight, is nacked and comes back later. Either way the
// effect happens once.
func TestNATSAckAfterAckWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		claimTimeout time.Duration
	}{
		{"claim waits for the first copy", 0},
		{"claim times out", 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			db := testdb.Postgres(t, "pgx")
			stream := natsStream(t, natsURL(), 1)
			ids := effects.PublishEvents(t, natsPublisher(t, natsURL()), stream, 30)
			slow := map[string]bool{ids[5]: true, ids[15]: true, ids[25]: true}

			billing := effects.NewServiceWith(t, db, "billing", sqlinbox.Config{ClaimTimeout: tc.claimTimeout})
			var (
				mu         sync.Mutex
				held       = map[string]bool{}
				holding    = map[string]chan struct{}{} // closed when a copy arrives
				gaveUp     = map[string]chan struct{}{} // closed when a copy's claim gave up (ErrInFlight)
				overlapped int
			)
			seeCopies := func(h message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					mu.Lock()
					if ch, ok := holding[msg.UUID]; ok {
						delete(holding, msg.UUID)
						close(ch)
						overlapped++
					}
					mu.Unlock()
					produced, err := h(msg)
					if errors.Is(err, inbox.ErrInFlight) {
						mu.Lock()
						if ch, ok := gaveUp[msg.UUID]; ok {
							delete(gaveUp, msg.UUID)
							close(ch)
						}
						mu.Unlock()
					}
					return produced, err
				}
			}
			// The first copy of a slow event to reach the handler holds its
			// transaction until a redelivery has reached the inbox and its
			// claim waits: with ClaimTimeout, until that claim gave up, however
			// long the copy took to reach it; without, a while longer.
			hold := func(msg *message.Message) error {
				mu.Lock()
				if !slow[msg.UUID] || held[msg.UUID] {
					mu.Unlock()
					return nil
				}
				held[msg.UUID] = true
				ch, gave := make(chan struct{}), make(chan struct{})
				holding[msg.UUID], gaveUp[msg.UUID] = ch, gave
				mu.Unlock()
				select {
				case <-ch:
					if tc.claimTimeout == 0 {
						time.Sleep(300 * time.Millisecond)
						return nil
					}
					select {
					case <-gave:
						return nil
					case <-time.After(effects.WaitFor):
						return errors.New("the copy's claim never gave up waiting (ErrInFlight)")
					}
				case <-time.After(effects.WaitFor):
					return errors.New("no redelivery arrived while the first copy held its transaction")
				}
			}
			causes := newDeliveries(map[string]func(*message.Message) bool{"redelivered after AckWait": natsRedelivered})
			// One subscription more than slow events: a redelivery always finds
			// a free one (the queue group picks at random; a copy that lands on
			// a busy one waits there and JetStream sends another after
			// AckWait).
			billing.Run(t, natsSubscriber(t, natsURL(), 300*time.Millisecond, len(slow)+1), stream, effects.RunConfig{
				Outer:       causes.middleware(seeCopies),
				AfterEffect: hold,
			})
			require.Eventually(t, func() bool { return billing.Handled.Load() == 30 }, effects.WaitFor, 20*time.Millisecond)
			natsDrained(t, natsURL(), stream)

			billing.RequireExactlyOnce(t, ids)
			require.Equal(t, len(slow), overlapped, "every slow event was redelivered while its first copy was in its transaction")
			o := billing.Outcomes()
			if tc.claimTimeout > 0 {
				require.Positive(t, o[observe.InFlight], "copies gave up waiting (ErrInFlight)")
			} else {
				require.Zero(t, o[observe.InFlight])
			}
			require.GreaterOrEqual(t, o[observe.Duplicate], int64(len(slow)))
			require.EqualValues(t, 30, o[observe.Processed])
			report(t, start, ids, causes, billing)
		})
	}
}

// A consumer process is SIGKILLed right after its 15th commit, with the
// messages JetStream pushed to it unacknowledged. JetStream redelivers them
// to the durable's next subscriber after AckWait; the committed one is a
// duplicate.
func TestNATSConsumerKilled(t *testing.T) {
	const ackWait = time.Second
	if killtest.ConsumeUntilKilled(t, func(c killtest.Consumer) message.Subscriber {
		return natsSubscriber(t, c.Server, ackWait, 1)
	}) {
		return
	}
	t.Parallel()
	start := time.Now()
	db := testdb.Postgres(t, "pgx")
	stream := natsStream(t, natsURL(), 1)
	ids := effects.PublishEvents(t, natsPublisher(t, natsURL()), stream, 40)
	billing := effects.NewService(t, db, "billing")

	committed := killtest.KillConsumer(t, billing, natsURL(), stream, 15)
	require.Equal(t, 15, committed, "one message at a time")

	causes := newDeliveries(map[string]func(*message.Message) bool{"redelivered after the kill": natsRedelivered})
	billing.Run(t, natsSubscriber(t, natsURL(), ackWait, 1), stream, effects.RunConfig{Outer: causes.middleware(nil)})
	require.Eventually(t, func() bool { return billing.Handled.Load() == int64(len(ids)-committed) }, effects.WaitFor, 20*time.Millisecond)
	natsDrained(t, natsURL(), stream)
	billing.RequireExactlyOnce(t, ids)

	o := billing.Outcomes()
	// One, the event committed before the kill; more if a handler took
	// longer than AckWait on a loaded machine.
	require.GreaterOrEqual(t, o[observe.Duplicate], int64(1), "the event committed before the kill was skipped")
	require.Greater(t, causes.count("redelivered after the kill"), 1, "deliveries pushed to the dead consumer came back")
	report(t, start, ids, causes, billing)
}

// natsURLs joins server URLs for a client that fails over between them.
func natsURLs(urls []string) string { return strings.Join(urls, ",") }

// Why natsJetStream subscribes with nats.ManualAck: watermill-nats stops
// waiting for a handler after its own AckWaitTimeout and cancels the
// message's context, which rolls the inbox transaction back. With
// ManualAck nothing was acked, and JetStream redelivers after AckWait;
// without it nats.go acks the message as watermill-nats's callback returns,
// and the event is lost although its handler succeeded.
func TestNATSManualAck(t *testing.T) {
	t.Parallel()
	for _, manualAck := range []bool{true, false} {
		t.Run(map[bool]string{true: "with ManualAck the event is redelivered", false: "without ManualAck the event is lost"}[manualAck], func(t *testing.T) {
			t.Parallel()
			db := testdb.Postgres(t, "pgx")
			stream := natsStream(t, natsURL(), 1)
			ids := effects.PublishEvents(t, natsPublisher(t, natsURL()), stream, 1)

			config := natsSubscriberConfig(natsURL(), time.Second, 1)
			config.AckWaitTimeout = 200 * time.Millisecond
			if !manualAck {
				config.JetStream.SubscribeOptions = []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit(), nats.AckWait(time.Second)}
			}
			sub, err := newCloseSafeSubscriber(config)
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Close() })
			billing := effects.NewService(t, db, "billing")
			var calls atomic.Int64
			billing.Run(t, sub, stream, effects.RunConfig{AfterEffect: func(*message.Message) error {
				if calls.Add(1) == 1 {
					time.Sleep(500 * time.Millisecond) // slower than AckWaitTimeout, faster than AckWait
				}
				return nil
			}})
			require.Eventually(t, func() bool {
				o := billing.Outcomes()
				return o[observe.RolledBack]+o[observe.CommitFailed] == 1
			}, effects.WaitFor, 20*time.Millisecond, "the first delivery's transaction was cancelled")
			if manualAck {
				// Any later delivery slower than AckWaitTimeout (a loaded
				// machine) is cancelled and redelivered the same way.
				billing.WaitEffects(t, 1)
				natsDrained(t, natsURL(), stream)
				billing.RequireExactlyOnce(t, ids)
				return
			}
			natsDrained(t, natsURL(), stream)
			time.Sleep(2 * time.Second) // twice AckWait: no redelivery comes
			require.EqualValues(t, 1, billing.Delivered.Load())
			require.Zero(t, billing.EffectRows(t), "the event was acked without its effect")
		})
	}
}
