package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	inbox "github.com/watermill-inbox/inbox"
)

// ConsumerHandler puts the inbox around the handler function itself, so a
// Retry added to the router afterwards still wraps it from outside: each
// attempt has its own transaction, and the failed attempts' writes roll back.
func ExampleConsumerHandler() {
	db, store, done := exampleStore()
	defer done()
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}

	attempts := 0
	router.AddConsumerHandler("stock", "orders", pubSub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		attempts++
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		if _, err := tx.ExecContext(msg.Context(), `UPDATE stock SET units = units - 1`); err != nil {
			return err
		}
		if attempts < 3 {
			return errors.New("warehouse API timed out")
		}
		return nil
	}))
	// Added after the handler: with router.AddMiddleware(mw) instead of
	// ConsumerHandler, this Retry would run inside the inbox transaction.
	router.AddMiddleware(middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond}.Middleware)

	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	defer router.Close()
	if err := pubSub.Publish("orders", message.NewMessage("order-1", nil)); err != nil {
		log.Fatal(err)
	}
	var units int
	_ = db.QueryRow(`SELECT units FROM stock`).Scan(&units)
	fmt.Println("attempts:", attempts, "units left:", units)
	// Output:
	// attempts: 3 units left: 9
}

// A handler whose only effect is an email after the commit writes nothing
// in SQL; TxNotNeeded says so, and the middleware does not report it as a
// handler that forgot the transaction.
func ExampleTxNotNeeded() {
	_, store, done := exampleStore()
	defer done()
	logger := watermill.NewCaptureLogger()
	mw, _ := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "welcome-email", Logger: logger})

	handler := inbox.Handler(mw, func(msg *message.Message) ([]*message.Message, error) {
		inbox.TxNotNeeded(msg.Context())
		return nil, inbox.AfterCommit(msg.Context(), func(context.Context) error {
			fmt.Println("email sent for", msg.UUID)
			return nil
		})
	})
	if _, err := handler(message.NewMessage("signup-42", nil)); err != nil {
		log.Fatal(err)
	}
	fmt.Println("reported:", len(logger.Captured()[watermill.ErrorLogLevel]))
	// Output:
	// email sent for signup-42
	// reported: 0
}
