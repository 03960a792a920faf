package conformancetest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
)

// Every event delivered four times, interleaved, through a router: one
// effect each.
func testEachEventHasOneEffect(t *testing.T, target Target) {
	b := setup(t, target)
	ps := pubsub()
	RunRouter(t, func(r *message.Router) {
		r.AddMiddleware(b.middleware(t, inbox.Config{}))
		r.AddConsumerHandler("billing", "events", ps, message.NoPublishHandlerFunc(func(msg *message.Message) error {
			return b.writeEffect(msg)
		}))
	})
	events := ids("ev", 10)
	for range 4 {
		for _, id := range events {
			// A fresh envelope each time, as a relay retry would build.
			publish(t, ps, "events", newMsg(id))
		}
	}
	require.Equal(t, once("billing", events...), b.effectCounts(t))
	require.Equal(t, len(events), b.claims(t))
}

// The producer's event_id survives a republish that changes msg.UUID; a
// redelivery of the same envelope (same UUID, no metadata) is caught by UUID.
func testEventIDMetadataBeatsEnvelopeUUID(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	h := b.handler(nil)
	for range 3 {
		_, err := call(mw, h, newMsg("order-42"))
		require.NoError(t, err)
	}
	plain := message.NewMessage(watermill.NewUUID(), nil)
	for range 3 {
		_, err := call(mw, h, plain.Copy())
		require.NoError(t, err)
	}
	require.Equal(t, map[string]int{"c/order-42": 1, "c/" + plain.UUID: 1}, b.effectCounts(t))
}

// Two routers (two processes, each with its own pool) subscribed to every
// message, sharing one consumer name: each event is processed by exactly one
// of them.
func testRacingRoutersOneWinner(t *testing.T, target Target) {
	b := setup(t, target)
	ps := pubsub()
	var processed atomic.Int64
	for i := range 2 {
		mw, _ := b.freshMiddleware(t, inbox.Config{Consumer: "billing"})
		RunRouter(t, func(r *message.Router) {
			r.AddMiddleware(mw)
			r.AddConsumerHandler(fmt.Sprintf("router-%d", i), "events", ps, message.NoPublishHandlerFunc(func(msg *message.Message) error {
				processed.Add(1)
				time.Sleep(time.Millisecond) // widen the race window
				return b.writeEffect(msg)
			}))
		})
	}
	events := ids("ev", 20)
	var wg sync.WaitGroup
	for _, id := range events {
		wg.Go(func() { publish(t, ps, "events", newMsg(id), newMsg(id)) })
	}
	wg.Wait()
	require.Equal(t, once("billing", events...), b.effectCounts(t))
	require.EqualValues(t, len(events), processed.Load(), "handler calls")
}

// Many goroutines claim the same ids at once through separate middleware
// instances: one winner per id, no errors.
func testConcurrentClaimsOneWinner(t *testing.T, target Target) {
	b := setup(t, target)
	const workers = 8
	events := ids("ev", 10)
	mws := make([]message.HandlerMiddleware, workers)
	for i := range mws {
		mws[i] = b.middleware(t, inbox.Config{Consumer: "c"})
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*len(events))
	for w := range workers {
		wg.Go(func() {
			for _, id := range events {
				if _, err := call(mws[w], b.handler(nil), newMsg(id)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		// A database with one writer may ask for a retry; it must say so.
		require.ErrorIs(t, err, inbox.ErrInFlight)
	}
	counts := b.effectCounts(t)
	for k, n := range counts {
		require.Equal(t, 1, n, "effects of %s", k)
	}
}
