package loop_test

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
)

// The complete loop, with failures at every hop:
//
//	A: order row + event in A's outbox, one transaction
//	relay A (crashes after publishing, republishes) -> Kafka "orders"
//	B: inbox + invoice row + invoice event in B's outbox, one transaction
//	   (crashes after commit before ack; restarted mid-stream)
//	relay B (crashes after publishing, republishes) -> Kafka "invoices"
//	C: inbox + notification row
//
// Every order has exactly one invoice and one notification, and the event
// ids the inboxes recorded are the ids the producers gave their events.
func TestCompleteLoop(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t, "pgx")
	b := newBroker(t)
	ordersTopic, invoicesTopic := b.topic(t, "orders"), b.topic(t, "invoices")

	outboxA := newOutbox(t, db)
	orders := newOrderService(t, db, outboxA)
	relayA := startRelay(t, outboxA, b.addrs, 4)

	outboxB := newOutbox(t, db)
	relayB := startRelay(t, outboxB, b.addrs, 5)
	billing := effects.NewService(t, db, "billing")
	crashB, crashesB := effects.NackAfterCommit(6)
	billingConfig := effects.RunConfig{
		Outer:             crashB,
		PublishTopic:      invoicesTopic,
		ProducedPublisher: outboxB.publisher,
		Produce: func(msg *message.Message) []*message.Message {
			// A new event with its own id. Carry the order's id under
			// another key: copying "event_id" metadata onto a new event
			// would make C's inbox take it for the order event.
			orderID, _, _ := inbox.EventIDFromContext(msg.Context())
			invoice := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order_event_id":%q}`, orderID))
			invoice.Metadata.Set("order_event_id", orderID)
			return []*message.Message{invoice}
		},
	}
	stopBilling := billing.Run(t, kafkaSubscriber(t, b.addrs, "billing"), ordersTopic, billingConfig)

	notifier := effects.NewService(t, db, "notifier")
	crashC, crashesC := effects.NackAfterCommit(7)
	notifier.Run(t, kafkaSubscriber(t, b.addrs, "notifier"), invoicesTopic, effects.RunConfig{
		Outer:     crashC,
		EffectKey: func(msg *message.Message) string { return msg.Metadata.Get("order_event_id") },
	})

	ids := orders.placeOrders(t, ordersTopic, 20)
	billing.WaitEffects(t, 10)
	stopBilling() // B restarts mid-stream
	billing.Run(t, kafkaSubscriber(t, b.addrs, "billing"), ordersTopic, billingConfig)
	ids = append(ids, orders.placeOrders(t, ordersTopic, 20)...)

	relayA.waitRelayed(t, len(ids))
	b.waitDrained(t, "billing", ordersTopic)
	relayB.waitRelayed(t, len(ids))
	b.waitDrained(t, "notifier", invoicesTopic)

	// B: one invoice per order, keyed by the id A gave the event: the id
	// survived A's outbox, the forwarder envelope and Kafka.
	billing.RequireExactlyOnce(t, ids)
	// C: one notification per order, through exactly one invoice event each.
	notifier.RequireExactlyOnce(t, ids)
	var invoiceEvents int
	require.NoError(t, db.QueryRow(`SELECT count(DISTINCT event_id) FROM `+notifier.Inbox).Scan(&invoiceEvents))
	require.Equal(t, len(ids), invoiceEvents, "C recorded one invoice event per order")

	require.Positive(t, relayA.crashes.Load())
	require.Positive(t, relayB.crashes.Load())
	require.EqualValues(t, int64(len(ids))+relayA.crashes.Load(), b.records(ordersTopic))
	require.EqualValues(t, int64(len(ids))+relayB.crashes.Load(), b.records(invoicesTopic),
		"B's outbox holds one invoice event per order: no rolled-back attempt leaked one")
	skippedB := billing.Delivered.Load() - billing.Handled.Load()
	skippedC := notifier.Delivered.Load() - notifier.Handled.Load()
	require.GreaterOrEqual(t, skippedB, relayA.crashes.Load()+crashesB.Load())
	require.GreaterOrEqual(t, skippedC, relayB.crashes.Load()+crashesC.Load())
	t.Logf("%d orders; relay A republished %d, B crashed after commit %d times and skipped %d duplicates; "+
		"relay B republished %d, C crashed %d times and skipped %d duplicates",
		len(ids), relayA.crashes.Load(), crashesB.Load(), skippedB, relayB.crashes.Load(), crashesC.Load(), skippedC)
}
