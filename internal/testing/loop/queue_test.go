package loop_test

import (
	"context"
	stdsql "database/sql"
	"fmt"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/killtest"
)

// watermill-sql v4.1's subscriber reads a batch in one transaction and,
// when it stops before the end of the batch (closed, or a message not acked
// within AckDeadline), still commits the ack query with every row of the
// batch. The queue schema's ack deletes (or marks) each row it is given, so
// the rest of the batch is gone without having been delivered. With one
// row per batch there is no rest. With a batch, the relay docs/outbox.md
// recommends sets AckDeadline to 0, so a message held long is still in
// flight, and closes through inbox.RelaySubscriber, which ends the
// subscription's context first: database/sql then refuses the ack query
// and the commit, and the whole batch stays to be delivered again.
func TestQueueRelayStoppedMidBatch(t *testing.T) {
	t.Parallel()
	const rows = 100
	for _, c := range []struct {
		batch int
		stop  string
		lost  int
	}{
		{batch: 1, stop: "close", lost: 0},
		{batch: 1, stop: "ack deadline", lost: 0},
		{batch: rows, stop: "close", lost: rows - 2},
		{batch: rows, stop: "ack deadline", lost: rows - 2},
		{batch: rows, stop: "relay close", lost: 0},
		{batch: rows, stop: "held, no ack deadline", lost: 0},
	} {
		t.Run(fmt.Sprintf("batch %d, %s", c.batch, c.stop), func(t *testing.T) {
			t.Parallel()
			lost := queueRelayStoppedMidBatch(t, c.batch, c.stop, rows)
			require.Equal(t, c.lost, lost, "rows never delivered")
		})
	}
}

// queueRelayStoppedMidBatch publishes rows messages, delivers the first,
// stops the relay's subscriber while the second is in flight (closed bare
// or through inbox.RelaySubscriber, or held past its AckDeadline; with
// none, held as long and then closed through inbox.RelaySubscriber), drains
// the queue with a new subscriber and returns how many messages were never
// delivered.
func queueRelayStoppedMidBatch(t *testing.T, batch int, stop string, rows int) (lost int) {
	db := testdb.MySQL(t)
	topic := testdb.Name("queue")
	t.Cleanup(func() { _, _ = db.Exec(mysqlDrop(topic)) })
	const shortDeadline = 200 * time.Millisecond
	ackDeadline := waitFor
	switch stop {
	case "ack deadline":
		ackDeadline = shortDeadline
	case "relay close", "held, no ack deadline":
		ackDeadline = 0
	}
	newSub := func() *wsql.Subscriber {
		sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
			PollInterval: relayPoll.poll, ResendInterval: relayPoll.resend, RetryInterval: relayPoll.retry, AckDeadline: &ackDeadline,
			SchemaAdapter:  wsql.MySQLQueueSchema{SubscribeBatchSize: batch},
			OffsetsAdapter: wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: true},
		}, logger)
		require.NoError(t, err)
		return sub
	}
	first := newSub()
	require.NoError(t, first.SubscribeInitialize(topic))
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: wsql.MySQLQueueSchema{}}, logger)
	require.NoError(t, err)
	var msgs []*message.Message
	for i := range rows {
		msgs = append(msgs, message.NewMessage(fmt.Sprintf("%s-%d", topic, i), []byte(`{}`)))
	}
	require.NoError(t, pub.Publish(topic, msgs...))

	delivered := map[string]bool{}
	var relay message.Subscriber = first
	if ackDeadline == 0 {
		relay = inbox.RelaySubscriber(first)
	}
	ch, err := relay.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	msg := receive(t, ch)
	delivered[msg.UUID] = true
	msg.Ack()
	msg = receive(t, ch)
	delivered[msg.UUID] = true
	if stop == "held, no ack deadline" {
		time.Sleep(3 * shortDeadline)
		require.NoError(t, msg.Context().Err(), "no deadline passed: the message is still in flight")
	}
	closed := make(chan error, 1)
	if stop != "ack deadline" {
		go func() { closed <- relay.Close() }()
	}
	<-msg.Context().Done() // the subscriber gave up on it
	msg.Ack()
	if stop == "ack deadline" {
		closed <- relay.Close()
	}
	require.NoError(t, <-closed)

	second := newSub()
	t.Cleanup(func() { _ = second.Close() })
	ch, err = second.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	deadline := time.After(waitFor)
	for mariadbV4.pendingRows(t, db, topic) > 0 {
		select {
		case msg := <-ch:
			delivered[msg.UUID] = true
			msg.Ack()
		case <-time.After(relayPoll.poll):
		case <-deadline:
			t.Fatal("the queue did not drain")
		}
	}
	for _, m := range msgs {
		if !delivered[m.UUID] {
			lost++
		}
	}
	return lost
}

func receive(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg := <-ch:
		return msg
	case <-time.After(waitFor):
		t.Fatal("no message")
		return nil
	}
}

// queueKillSpec is the child's spec in TestQueueRelayKilledMidBatch.
type queueKillSpec struct {
	Topic, Published string
	DieAfter         int
}

// The queue relay docs/outbox.md recommends, SIGKILLed in the middle of a
// batch of 100 (in a child process): its transaction never commits, so
// every row of the batch stays, and the next relay publishes each again,
// those the dead one published included. The broker here is a MariaDB table
// written in autocommit, as a publish with confirms is durable before the
// ack.
func TestQueueRelayKilledMidBatch(t *testing.T) {
	var spec queueKillSpec
	if killtest.Child(&spec) {
		db := testdb.MySQL(t)
		published := 0
		runQueueRelay(t, db, spec.Topic, spec.Published, func() {
			if published++; published == spec.DieAfter {
				_ = killtest.Kill(context.Background())
			}
		})
		killtest.Linger(t)
		return
	}
	t.Parallel()
	const rows, dieAfter = 250, 150 // the second batch of 100, half published
	db := testdb.MySQL(t)
	topic := testdb.Name("queue")
	t.Cleanup(func() { _, _ = db.Exec(mysqlDrop(topic)) })
	broker := testdb.Table(t, db, "broker")
	_, err := db.Exec(`CREATE TABLE ` + broker + ` (uuid VARCHAR(64) NOT NULL)`)
	require.NoError(t, err)
	sub, err := mysqlQueueRelay(queueBatch)(db)
	require.NoError(t, err)
	require.NoError(t, sub.SubscribeInitialize(topic))
	require.NoError(t, sub.Close())
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: wsql.MySQLQueueSchema{}}, logger)
	require.NoError(t, err)
	uuids := map[string]bool{}
	for i := range rows {
		msg := message.NewMessage(fmt.Sprintf("%s-%d", topic, i), []byte(`{}`))
		uuids[msg.UUID] = true
		require.NoError(t, pub.Publish(topic, msg))
	}

	killtest.Run(t, queueKillSpec{Topic: topic, Published: broker, DieAfter: dieAfter})
	require.Equal(t, rows-queueBatch, mariadbV4.pendingRows(t, db, topic),
		"the first batch committed, the second rolled back with the dead session")

	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		runQueueRelayCtx(ctx, t, db, topic, broker, func() {
			if mariadbV4.pendingRows(t, db, topic) == 0 {
				cancel()
			}
		})
	}()
	require.Eventually(t, func() bool { return mariadbV4.pendingRows(t, db, topic) == 0 }, waitFor, 20*time.Millisecond)

	copies := map[string]int{}
	rowsOf, err := db.Query(`SELECT uuid FROM ` + broker)
	require.NoError(t, err)
	defer rowsOf.Close()
	for rowsOf.Next() {
		var id string
		require.NoError(t, rowsOf.Scan(&id))
		copies[id]++
	}
	require.NoError(t, rowsOf.Err())
	var doubled int
	for id := range uuids {
		require.Positive(t, copies[id], "row %s never published", id)
		if copies[id] > 1 {
			doubled++
		}
	}
	require.Equal(t, dieAfter-queueBatch, doubled, "the dead relay's half batch is published twice, nothing else")
}

// runQueueRelay relays topic's queue into the table published, one row
// per message in autocommit, calling after each publish, until the test ends.
func runQueueRelay(t *testing.T, db *stdsql.DB, topic, published string, after func()) {
	runQueueRelayCtx(t.Context(), t, db, topic, published, after)
}

func runQueueRelayCtx(ctx context.Context, t *testing.T, db *stdsql.DB, topic, published string, after func()) {
	sub, err := mysqlQueueRelay(queueBatch)(db)
	require.NoError(t, err)
	relay := inbox.RelaySubscriber(sub)
	defer relay.Close()
	ch, err := relay.Subscribe(ctx, topic)
	require.NoError(t, err)
	for msg := range ch {
		if _, err := db.Exec(`INSERT INTO `+published+` (uuid) VALUES (?)`, msg.UUID); err != nil {
			msg.Nack()
			continue
		}
		msg.Ack()
		after()
	}
}
