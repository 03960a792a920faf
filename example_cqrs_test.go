package inbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	inbox "github.com/watermill-inbox/inbox"
)

type StockReserved struct {
	OrderID string `json:"order_id"`
}

// With Watermill's CQRS component the inbox is the same router-level
// middleware: the event processor adds its handlers to the router, the
// handler name ("ReleaseStock") is the consumer, and the handler's context
// carries the transaction. Here a relay publishes the same event message
// twice; the stock is released once.
func Example_cqrs() {
	db, store, done := exampleStore()
	defer done()
	logger := watermill.NopLogger{}
	// A publish returns once the handler acked the message, so the
	// example can read the result right after.
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(middleware.Recoverer, mw)

	marshaler := cqrs.JSONMarshaler{}
	processor, err := cqrs.NewEventProcessorWithConfig(router, cqrs.EventProcessorConfig{
		GenerateSubscribeTopic: func(p cqrs.EventProcessorGenerateSubscribeTopicParams) (string, error) {
			return p.EventName, nil
		},
		SubscriberConstructor: func(cqrs.EventProcessorSubscriberConstructorParams) (message.Subscriber, error) {
			return pubSub, nil
		},
		Marshaler: marshaler,
		Logger:    logger,
	})
	if err != nil {
		log.Fatal(err)
	}
	err = processor.AddHandlers(cqrs.NewEventHandler("ReleaseStock", func(ctx context.Context, e *StockReserved) error {
		tx, ok := inbox.TxFromContext(ctx)
		if !ok {
			return inbox.ErrNotInInbox
		}
		_, err := tx.ExecContext(ctx, `UPDATE stock SET units = units + 1`)
		_, consumer, _ := inbox.EventIDFromContext(ctx)
		fmt.Println("releasing stock of", e.OrderID, "as consumer", consumer)
		return err
	}))
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = router.Run(context.Background()) }()
	defer router.Close()
	<-router.Running()

	// An EventBus would marshal the event into a new message on every
	// Publish; a relay retry sends the same message again.
	msg, err := marshaler.Marshal(&StockReserved{OrderID: "order-1"})
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		if err := pubSub.Publish(marshaler.Name(&StockReserved{}), msg.Copy()); err != nil {
			log.Fatal(err)
		}
	}
	var units int
	_ = db.QueryRow(`SELECT units FROM stock`).Scan(&units)
	fmt.Println("units:", units)
	// Output:
	// releasing stock of order-1 as consumer ReleaseStock
	// units: 11
}
