package loop_test

import (
	"cmp"
	"context"
	stdsql "database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqlv3 "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The chain's size: chainEvents orders, each relayed chainCopies times to
// B, whose 2 replicas consume chainPartitions partitions (4 handlers in
// flight each). The old MySQL relay runs oldChainEvents, with which it
// loses some every run.
const (
	chainEvents     = 150
	oldChainEvents  = 400
	chainCopies     = 3
	chainPartitions = 8
)

// drainFor bounds the wait for a relay to publish its outbox. A MySQL
// relay reads in a serializable transaction that holds the end of the table
// while it publishes, so the inserts wait for it and the chain moves at its
// pace: slow on a busy machine, never stuck.
const drainFor = 3 * waitFor

// oldRelayEnv runs the chain also on the MariaDB relay docs/outbox.md
// recommended before (the default MySQL schema and its offsets adapter),
// which loses events: INBOX_TEST_OLD_MYSQL_RELAY=1.
const oldRelayEnv = "INBOX_TEST_OLD_MYSQL_RELAY"

// The complete loop on every database and watermill-sql version
// docs/outbox.md documents, built as a user builds it:
//
//	A: order row + order event in A's outbox, one transaction
//	relay A -> Kafka "orders", every event published 3 times; the broker
//	   refuses 20 publishes in a row; shut down gracefully while its batch is
//	   in flight (A writes faster than it publishes), then replaced
//	B, 2 replicas, 8 handlers in flight: inbox claim + invoice event in B's
//	   outbox, a random pause between the outbox write and the commit (so
//	   that rows commit out of their insert order); crashes after commits,
//	   one replica stopped and started again mid-stream
//	relay B, 2 replicas: one's database session killed after a publish, the
//	   other shut down gracefully while a row is in flight, then replaced
//	C: inbox claim + notification row
//
// C must hold exactly one notification per order: none lost, none doubled.
func TestChainEveryOutboxConfiguration(t *testing.T) {
	t.Parallel()
	configs := []outboxConfig{postgresV3, postgresV4, mariadbV3, mariadbV4}
	events := map[string]int{}
	if os.Getenv(oldRelayEnv) != "" {
		configs = append(configs, mariadbV3Offsets, mariadbV4Offsets)
		events[mariadbV3Offsets.name], events[mariadbV4Offsets.name] = oldChainEvents, oldChainEvents
	}
	for _, c := range configs {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runChain(t, c, cmp.Or(events[c.name], chainEvents))
		})
	}
}

func runChain(t *testing.T, c outboxConfig, events int) {
	start := time.Now()
	db := c.open(t)
	b := newBroker(t)
	ordersTopic := b.topicWith(t, "orders", chainPartitions)
	invoicesTopic := b.topic(t, "invoices")
	kafkaPub := kafkaPublisher(t, b.addrs)
	storeConfig := sqlinbox.Config{Dialect: c.dialect()}

	outboxA := newOutboxWith(t, db, c)
	orders := newOrderService(t, db, outboxA)
	refused := &refusing{Publisher: copies{kafkaPub, chainCopies}, from: int64(events / 4), n: 20}
	shutdownA := &midBatchShutdown{at: int64(events / 2), relay: make(chan *relay, 1), stopped: make(chan struct{})}
	shutdownA.relay <- startRelayWith(t, outboxA, refused, relayOptions{after: shutdownA.middleware})

	outboxB := newOutboxWith(t, db, c)
	billing := effects.NewServiceWith(t, db, "billing", storeConfig)
	crashB, crashesB := effects.NackAfterCommit(7)
	billingConfig := effects.RunConfig{
		Outer:        crashB,
		PublishTopic: invoicesTopic,
		ProducedPublisher: func(tx *stdsql.Tx) (message.Publisher, error) {
			pub, err := outboxB.publisher(tx)
			return pauseAfter{pub}, err
		},
		Produce: func(msg *message.Message) []*message.Message {
			orderID, _, _ := inbox.EventIDFromContext(msg.Context())
			invoice := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order_event_id":%q}`, orderID))
			invoice.Metadata.Set("order_event_id", orderID)
			return []*message.Message{invoice}
		},
	}
	stopB1 := billing.Run(t, kafkaSubscriber(t, b.addrs, "billing"), ordersTopic, billingConfig)
	billing.Run(t, kafkaSubscriber(t, b.addrs, "billing"), ordersTopic, billingConfig)

	kill := &sessionKill{db: db, mysql: c.mysql, at: int64(events / 10)}
	startRelayWith(t, outboxB, kafkaPub, relayOptions{after: kill.middleware})
	shutdown := &midBatchShutdown{at: int64(events / 8), relay: make(chan *relay, 1), stopped: make(chan struct{})}
	shutdown.relay <- startRelayWith(t, outboxB, kafkaPub, relayOptions{after: shutdown.middleware})

	notifier := effects.NewServiceWith(t, db, "notifier", storeConfig)
	notifier.Run(t, kafkaSubscriber(t, b.addrs, "notifier"), invoicesTopic, effects.RunConfig{
		EffectKey: func(msg *message.Message) string { return msg.Metadata.Get("order_event_id") },
	})

	ids := orders.placeOrders(t, ordersTopic, events)
	select {
	case <-shutdownA.stopped: // gracefully, with its batch in flight
	case <-time.After(drainFor):
		t.Fatal("relay A did not shut down at its row")
	}
	startRelayWith(t, outboxA, refused, relayOptions{})
	billing.WaitEffects(t, events/3)
	stopB1() // B restarts mid-stream
	billing.Run(t, kafkaSubscriber(t, b.addrs, "billing"), ordersTopic, billingConfig)

	select {
	case <-shutdown.stopped: // gracefully, with a row in flight
	case <-time.After(waitFor):
		t.Fatal("relay B did not shut down at its row")
	}
	startRelayWith(t, outboxB, kafkaPub, relayOptions{})

	require.Eventually(t, func() bool { return outboxA.pending(t) == 0 }, drainFor, 20*time.Millisecond, "relay A did not drain")
	b.waitDrained(t, "billing", ordersTopic)
	billing.RequireExactlyOnce(t, ids)
	require.Eventually(t, func() bool { return outboxB.pending(t) == 0 }, drainFor, 20*time.Millisecond, "relay B did not drain")
	b.waitDrained(t, "notifier", invoicesTopic)
	require.True(t, kill.done.Load(), "relay B's session was killed once")
	require.GreaterOrEqual(t, refused.calls.Load(), refused.from+refused.n, "the broker refused relay A's publishes for a while")

	counts := notifier.EffectCounts(t)
	var lost, doubled int
	for _, id := range ids {
		switch n := counts[id]; {
		case n == 0:
			lost++
		case n > 1:
			doubled++
		}
	}
	t.Logf("%s: %d events sent (%d deliveries to B, %d redelivered after a commit), %d effects in C, %d lost, %d doubled; %d records relayed to C, in %s",
		c.name, len(ids), billing.Delivered.Load(), crashesB.Load(), notifier.EffectRows(t), lost, doubled,
		b.records(invoicesTopic), time.Since(start).Round(100*time.Millisecond))
	notifier.RequireExactlyOnce(t, ids)
}

// topicWith creates a topic with a unique name and n partitions.
func (b *broker) topicWith(t testing.TB, prefix string, n int32) string {
	t.Helper()
	name := testdb.Name(prefix)
	require.NoError(t, b.CreateTopic(name, n, nil))
	return name
}

// copies publishes every message n times, as a relay that crashes after
// each publish would.
type copies struct {
	message.Publisher
	n int
}

func (c copies) Publish(topic string, msgs ...*message.Message) error {
	for range c.n {
		if err := c.Publisher.Publish(topic, msgs...); err != nil {
			return err
		}
	}
	return nil
}

// refusing is a broker that refuses publishes from its from-th call, n
// times in a row: the relay's handler fails, the row stays in flight and
// is published again.
type refusing struct {
	message.Publisher
	from, n int64
	calls   atomic.Int64
}

func (r *refusing) Publish(topic string, msgs ...*message.Message) error {
	if c := r.calls.Add(1); c >= r.from && c < r.from+r.n {
		return errors.New("the broker refused the publish")
	}
	return r.Publisher.Publish(topic, msgs...)
}

// pauseAfter pauses up to 10 ms after writing to the outbox, before the
// claim's transaction commits, so that rows commit out of insert order.
type pauseAfter struct{ message.Publisher }

func (p pauseAfter) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	time.Sleep(rand.N(10 * time.Millisecond))
	return err
}

// sessionKill kills, from the server side, the database session of the
// relay's transaction after it published its at-th row, as the server sees
// a relay process die: the transaction rolls back, and the rows it had
// published are published again.
type sessionKill struct {
	db    *stdsql.DB
	mysql bool
	at    int64
	rows  atomic.Int64
	done  atomic.Bool
}

func (k *sessionKill) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil || k.rows.Add(1) != k.at {
			return out, err
		}
		tx := relayTx(msg.Context())
		if tx == nil {
			return nil, fmt.Errorf("no relay transaction in the message's context")
		}
		ctx := context.Background()
		var id int64
		if k.mysql {
			if err := tx.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
				return nil, err
			}
			_, err = k.db.Exec(fmt.Sprintf(`KILL CONNECTION %d`, id))
		} else {
			if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&id); err != nil {
				return nil, err
			}
			_, err = k.db.Exec(`SELECT pg_terminate_backend($1)`, id)
		}
		if err != nil {
			return nil, err
		}
		k.done.Store(true)
		return out, nil
	}
}

// relayTx is the transaction a watermill-sql subscriber (v3 or v4) read
// the message in.
func relayTx(ctx context.Context) *stdsql.Tx {
	if tx, ok := wsqlv3.TxFromContext(ctx); ok {
		return tx
	}
	if tx, ok := wsql.TxFromContext(ctx); ok {
		if std, ok := tx.(*wsql.StdSQLTx); ok {
			return std.Tx
		}
	}
	return nil
}

// midBatchShutdown shuts its relay down gracefully once the relay has
// published its at-th row, and holds that row until the shutdown ended its
// subscriber's context, then lets the forwarder ack it: the relay stops with
// that row, and the rest of its batch, in flight.
type midBatchShutdown struct {
	at      int64
	rows    atomic.Int64
	relay   chan *relay // the relay to shut down, sent once it runs
	stopped chan struct{}
}

func (s *midBatchShutdown) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil || s.rows.Add(1) != s.at {
			return out, err
		}
		go func() {
			(<-s.relay).stop()
			close(s.stopped)
		}()
		select {
		case <-msg.Context().Done():
		case <-time.After(waitFor):
		}
		return out, err
	}
}
