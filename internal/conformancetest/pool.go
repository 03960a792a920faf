package conformancetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
)

// SecondConnection is the misuse PoolMisuse plays: a handler that takes a
// second connection from the pool its inbox transaction came from.
type SecondConnection func(ctx context.Context) error

// PoolMisuse delivers copies copies of each of events events at once, each
// copy retried until it is acked, through mw, whose handler takes a second
// connection from the pool the inbox claims from (second) before it
// returns. It fails unless every delivery ends within the deadline: the
// router makes progress. It returns the handler's successful calls per
// event id, and the errors of the failed attempts.
func PoolMisuse(t *testing.T, mw message.HandlerMiddleware, events, copies int, second SecondConnection) (map[string]int, []error) {
	t.Helper()
	const deadline = 90 * time.Second
	var (
		mu          sync.Mutex
		errs        []error
		handled     = map[string]int{}
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
		mu.Lock()
		handled[id]++
		mu.Unlock()
		return nil, nil
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
					if errors.Is(err, inbox.ErrMiswired) {
						return // refused for good: progress, and loud
					}
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
	require.NoError(t, ctx.Err(), "the deliveries outlived the deadline: the consumer is wedged")
	mu.Lock()
	defer mu.Unlock()
	return handled, errs
}
