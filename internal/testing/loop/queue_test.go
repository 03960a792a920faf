package loop_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
)

// watermill-sql v4.1's subscriber reads a batch in one transaction and,
// when it stops before the end of the batch (closed, or a message not acked
// within AckDeadline), still commits the ack query with every row of the
// batch. The queue schema's ack deletes (or marks) each row it is given, so
// the rest of the batch is gone without having been delivered. With one
// row per batch there is no rest: the unacked row stays and is delivered
// again. This is why docs/outbox.md sets SubscribeBatchSize to 1 on the
// MariaDB relay.
func TestQueueRelayStoppedMidBatch(t *testing.T) {
	t.Parallel()
	const rows = 10
	for _, c := range []struct {
		batch int
		stop  string
		lost  int
	}{
		{batch: 1, stop: "close", lost: 0},
		{batch: 1, stop: "ack deadline", lost: 0},
		{batch: rows, stop: "close", lost: rows - 2},
		{batch: rows, stop: "ack deadline", lost: rows - 2},
	} {
		t.Run(fmt.Sprintf("batch %d, %s", c.batch, c.stop), func(t *testing.T) {
			t.Parallel()
			lost := queueRelayStoppedMidBatch(t, c.batch, c.stop, rows)
			require.Equal(t, c.lost, lost, "rows never delivered")
		})
	}
}

// queueRelayStoppedMidBatch publishes rows messages, delivers the first,
// stops the relay's subscriber while the second is in flight (closed, or
// held past its AckDeadline), drains the queue with a new subscriber and
// returns how many messages were never delivered.
func queueRelayStoppedMidBatch(t *testing.T, batch int, stop string, rows int) (lost int) {
	db := testdb.MySQL(t)
	topic := testdb.Name("queue")
	t.Cleanup(func() { _, _ = db.Exec(mysqlDrop(topic)) })
	ackDeadline := waitFor
	if stop == "ack deadline" {
		ackDeadline = 200 * time.Millisecond
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
	ch, err := first.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	msg := receive(t, ch)
	delivered[msg.UUID] = true
	msg.Ack()
	msg = receive(t, ch)
	delivered[msg.UUID] = true
	closed := make(chan error, 1)
	if stop == "close" {
		go func() { closed <- first.Close() }()
	}
	<-msg.Context().Done() // the subscriber gave up on it
	msg.Ack()
	if stop != "close" {
		closed <- first.Close()
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
