package conformancetest

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
)

// The handler writes, then fails on its first attempt: the write rolls back,
// the redelivery runs the handler again and commits once.
func testHandlerErrorRollsBack(t *testing.T, target Target) {
	b := setup(t, target)
	ps := pubsub()
	boom := errors.New("boom")
	RunRouter(t, func(r *message.Router) {
		r.AddMiddleware(b.middleware(t, inbox.Config{}))
		r.AddConsumerHandler("billing", "events", ps, func(msg *message.Message) error {
			_, err := b.handler(func(_ string, attempt int) error {
				if attempt == 1 {
					return boom
				}
				return nil
			})(msg)
			return err
		})
	})
	events := ids("ev", 5)
	for _, id := range events {
		publish(t, ps, "events", newMsg(id))
	}
	require.Equal(t, once("billing", events...), b.effectCounts(t))
	for _, id := range events {
		require.Equal(t, 2, b.attemptsOf(id), "attempts of %s", id)
	}

	// Called directly, the error reaches the caller and nothing stays.
	mw := b.middleware(t, inbox.Config{Consumer: "direct"})
	_, err := call(mw, b.handler(func(string, int) error { return boom }), newMsg("x"))
	require.ErrorIs(t, err, boom)
	require.NotContains(t, b.effectCounts(t), "direct/x")
}

// A panic after the write rolls the transaction back and keeps panicking
// with the same value, so Recoverer (outside the inbox) still sees it.
func testHandlerPanicRollsBack(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	msg := newMsg("p")
	require.PanicsWithValue(t, "handler exploded", func() {
		_, _ = call(mw, func(msg *message.Message) ([]*message.Message, error) {
			require.NoError(t, b.writeEffect(msg))
			panic("handler exploded")
		}, msg)
	})
	require.Empty(t, b.effectCounts(t))
	require.Zero(t, b.claims(t))
	_, err := call(mw, b.handler(nil), msg)
	require.NoError(t, err)
	require.Equal(t, once("c", "p"), b.effectCounts(t))
}

// Recoverer outside the inbox turns the panic into a nack; the redelivery
// commits once.
func testPanicUnderRecovererIsRedelivered(t *testing.T, target Target) {
	b := setup(t, target)
	ps := pubsub()
	RunRouter(t, func(r *message.Router) {
		r.AddMiddleware(middleware.Recoverer, b.middleware(t, inbox.Config{}))
		r.AddConsumerHandler("billing", "events", ps, func(msg *message.Message) error {
			_, err := b.handler(func(_ string, attempt int) error {
				if attempt == 1 {
					panic("first attempt panics")
				}
				return nil
			})(msg)
			return err
		})
	})
	publish(t, ps, "events", newMsg("a"), newMsg("b"), newMsg("a"))
	require.Equal(t, once("billing", "a", "b"), b.effectCounts(t))
	require.Equal(t, 2, b.attemptsOf("a"))
}
