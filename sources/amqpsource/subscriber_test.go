package amqpsource_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox/sources/amqpsource"
)

// amqpURL is the suite's RabbitMQ.
func amqpURL() string {
	if v := os.Getenv("INBOX_TEST_AMQP_URL"); v != "" {
		return v
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// NewSubscriber refuses a configuration it cannot honour.
func TestNewSubscriberRefuses(t *testing.T) {
	for _, tc := range []struct {
		config amqpsource.Config
		want   string
	}{
		{amqpsource.Config{}, "URL is required"},
		{amqpsource.Config{URL: amqpURL(), Prefetch: -1}, "Prefetch (-1) must not be negative"},
	} {
		_, err := amqpsource.NewSubscriber(tc.config)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("NewSubscriber(%+v) = %v, want an error with %q", tc.config, err, tc.want)
		}
	}
}

// A subscription hands over Prefetch messages none of which is acked yet
// (a watermill-amqp subscription hands over one); a nacked one comes back
// marked redelivered; Close requeues what was not acked.
func TestSubscriptionKeepsPrefetchUnacked(t *testing.T) {
	queue := fmt.Sprintf("amqpsource_%d", time.Now().UnixNano())
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		t.Fatalf("no RabbitMQ answers at %s (run ./test.sh, which starts one): %v", amqpURL(), err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	must(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	must(t, err)
	t.Cleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false) })
	pub, err := wamqp.NewPublisher(wamqp.NewDurableQueueConfig(amqpURL()), watermill.NopLogger{})
	must(t, err)
	defer pub.Close()
	for i := range 10 {
		msg := message.NewMessage(fmt.Sprintf("m-%d", i), nil)
		msg.Metadata.Set("n", fmt.Sprint(i))
		must(t, pub.Publish(queue, msg))
	}

	sub, err := amqpsource.NewSubscriber(amqpsource.Config{URL: amqpURL(), Prefetch: 5})
	must(t, err)
	msgs, err := sub.Subscribe(context.Background(), queue)
	must(t, err)
	var held []*message.Message
	for range 5 {
		held = append(held, receive(t, msgs))
	}
	for i, msg := range held {
		if want := fmt.Sprintf("m-%d", i); msg.UUID != want || msg.Metadata.Get("n") != fmt.Sprint(i) {
			t.Fatalf("message %d: %s %v, want %s", i, msg.UUID, msg.Metadata, want)
		}
	}
	held[0].Nack()
	for _, msg := range held[1:] {
		msg.Ack()
	}
	seen := map[string]bool{}
	for range 5 {
		msg := receive(t, msgs)
		seen[msg.UUID] = true
		if msg.UUID == "m-0" && !wamqp.IsMessageRedelivered(msg) {
			t.Fatal("the nacked message came back without the redelivered mark")
		}
	}
	if !seen["m-0"] {
		t.Fatalf("the nacked message did not come back among %v", seen)
	}
	must(t, sub.Close())
	if _, ok := <-msgs; ok {
		t.Fatal("the subscription's channel stayed open after Close")
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	must(t, err)
	if q.Messages != 6 {
		t.Fatalf("%d messages ready after Close, want the 6 never acked", q.Messages)
	}
}

func receive(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-msgs:
		if !ok {
			t.Fatal("the subscription closed")
		}
		return msg
	case <-time.After(30 * time.Second):
		t.Fatal("no message within 30s")
	}
	return nil
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// declareQueue declares queue as amqpsource and watermill-amqp's durable
// queue configuration do, for a publisher that publishes before anyone
// subscribes; the function it returns deletes it.
func declareQueue(queue string) (deleteQueue func()) {
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		panic(err)
	}
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	}
	if err != nil {
		panic(err)
	}
	return func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = conn.Close()
	}
}
