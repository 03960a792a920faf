package conformancetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	inbox "github.com/watermill-inbox/inbox"
)

// SecondConnection is the misuse PoolMisuse plays: a handler that takes a
// second connection from the pool its inbox transaction came from.
type SecondConnection func(ctx context.Context) error

// Effect writes the handler's effect for event id in the inbox transaction
// of ctx.
type Effect func(ctx context.Context, id string) error

// PoolMisuse delivers copies copies of each of events events at once, each
// copy retried until it is acked or ctx ends, through mw, whose handler takes
// a second connection from the pool the inbox claims from (second), then
// writes its effect (effect). It fails unless every delivery ends within
// deadline: the router makes progress. It returns the errors of the failed
// attempts; the caller counts the committed effects, since a handler call
// is not an effect until its commit.
func PoolMisuse(t *testing.T, mw message.HandlerMiddleware, events, copies int, deadline time.Duration, second SecondConnection, effect Effect) []error {
	t.Helper()
	var (
		mu          sync.Mutex
		errs        []error
		wg          sync.WaitGroup
		start       = make(chan struct{})
		ctx, cancel = context.WithTimeout(context.Background(), deadline)
	)
	defer cancel()
	h := mw(func(msg *message.Message) ([]*message.Message, error) {
		// Long enough for the other copies to claim, or to wait for
		// their claims, before this handler asks for its second
		// connection: the order that wedges a pool.
		time.Sleep(200 * time.Millisecond)
		if err := second(msg.Context()); err != nil {
			return nil, err
		}
		id, _, _ := inbox.EventIDFromContext(msg.Context())
		return nil, effect(msg.Context(), id)
	})
	for e := range events {
		id := fmt.Sprintf("ev-%d", e)
		for range copies {
			wg.Go(func() {
				<-start
				for ctx.Err() == nil {
					msg := message.NewMessage(watermill.NewUUID(), nil)
					msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, id)
					msg.SetContext(ctx)
					_, err := h(msg)
					if err == nil {
						return
					}
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	close(start)
	select {
	case <-done:
	case <-time.After(deadline + 10*time.Second):
		t.Fatalf("the deliveries are still not done after %s: the consumer is wedged", deadline)
	}
	mu.Lock()
	defer mu.Unlock()
	return errs
}
