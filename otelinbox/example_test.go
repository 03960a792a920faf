package otelinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	_ "modernc.org/sqlite"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/otelinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Each message gets an "inbox <consumer>" span with a child "inbox claim"
// span; the outcome is an attribute. An application would use its own
// tracer provider (or the global one, the default) instead of the
// recorder used here to print the spans.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file::memory:") // your database
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // each connection to :memory: is a database of its own
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(ctx) //nolint:errcheck // example
	mw, err := inbox.NewMiddleware(inbox.Config{
		Store: store, Consumer: "invoicing",
		Observer: otelinbox.New(otelinbox.Config{TracerProvider: tp}),
	})
	if err != nil {
		log.Fatal(err)
	}
	handler := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for range 2 {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set("event_id", "order-1")
		if _, err := handler(msg); err != nil {
			log.Fatal(err)
		}
	}

	for _, s := range spans.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == otelinbox.AttrOutcome {
				fmt.Printf("%s: %s=%s\n", s.Name(), kv.Key, kv.Value.AsString())
			}
		}
		if s.Name() == "inbox claim" {
			fmt.Println("inbox claim")
		}
	}
	// Output:
	// inbox claim
	// inbox invoicing: inbox.outcome=processed
	// inbox claim
	// inbox invoicing: inbox.outcome=duplicate
}

// A producer's trace travels in the message metadata as a W3C traceparent;
// ContextFromMetadata puts its span context in the message context, where
// the inbox middleware that comes next finds the parent of its span.
func ExampleContextFromMetadata() {
	// In a router: router.AddMiddleware(otelinbox.ContextFromMetadata(nil)),
	// then the inbox middleware; nil uses the global propagator.
	mw := otelinbox.ContextFromMetadata(propagation.TraceContext{})
	handler := mw(func(msg *message.Message) ([]*message.Message, error) {
		sc := trace.SpanContextFromContext(msg.Context())
		fmt.Println("trace:", sc.TraceID())
		fmt.Println("parent span:", sc.SpanID())
		return nil, nil
	})

	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if _, err := handler(msg); err != nil {
		log.Fatal(err)
	}
	// Output:
	// trace: 4bf92f3577b34da6a3ce929d0e0e4736
	// parent span: 00f067aa0ba902b7
}
