package conformancetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// holdClaim starts handling id and blocks inside the transaction until the
// returned release is called with the handler's result.
func holdClaim(t *testing.T, b *bundle, mw message.HandlerMiddleware, id string) (release func(error), done <-chan error) {
	entered := make(chan struct{})
	result := make(chan error, 1)
	// A test that fails before releasing the claim would otherwise leave it
	// held, and the cleanup dropping the table would wait for its lock
	// forever: release it first (cleanups run last registered first).
	t.Cleanup(func() {
		select {
		case result <- errors.New("the test ended without releasing the claim"):
		default:
		}
	})
	out := deliverAsync(mw, func(msg *message.Message) ([]*message.Message, error) {
		if err := b.writeEffect(msg); err != nil {
			return nil, err
		}
		close(entered)
		return nil, <-result
	}, newMsg(id))
	select {
	case <-entered:
	case err := <-out:
		t.Fatalf("first delivery ended early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("first delivery never reached the handler")
	}
	return func(err error) { result <- err }, out
}

// deliverAsync handles msg with h behind mw in the background; the result
// arrives on the returned channel.
func deliverAsync(mw message.HandlerMiddleware, h message.HandlerFunc, msg *message.Message) <-chan error {
	out := make(chan error, 1)
	go func() {
		_, err := call(mw, h, msg)
		out <- err
	}()
	return out
}

// A duplicate arriving while the first copy is still in its transaction
// waits, then sees the committed claim and is skipped.
func testInFlightDuplicateWaits(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	release, first := holdClaim(t, b, mw, "x")
	second := deliverAsync(mw, b.handler(nil), newMsg("x"))
	select {
	case err := <-second:
		t.Fatalf("duplicate finished while the first copy was in flight: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	release(nil)
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	require.Equal(t, once("c", "x"), b.effectCounts(t))
	require.Equal(t, 1, b.attemptsOf("x"))
}

// When the first copy rolls back, the waiting duplicate takes over.
func testInFlightRollbackLetsDuplicateThrough(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	release, first := holdClaim(t, b, mw, "x")
	second := deliverAsync(mw, b.handler(nil), newMsg("x"))
	time.Sleep(100 * time.Millisecond)
	boom := errors.New("boom")
	release(boom)
	require.ErrorIs(t, <-first, boom)
	require.NoError(t, <-second)
	require.Equal(t, once("c", "x"), b.effectCounts(t))
	require.Equal(t, 2, b.attemptsOf("x"))
}

// With a claim timeout, the in-flight duplicate gives up with ErrInFlight
// instead of holding its connection; later it is a plain duplicate.
func testClaimTimeout(t *testing.T, target Target) {
	if !target.ClaimTimeout {
		t.Skipf("%s cannot bound a claim's wait", target.Name)
	}
	timeout := max(target.ClaimTimeoutUnit, 100*time.Millisecond)
	b := setup(t, target, func(c *sqlinbox.Config) { c.ClaimTimeout = timeout })
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	release, first := holdClaim(t, b, mw, "x")
	start := time.Now()
	_, err := call(mw, b.handler(nil), newMsg("x"))
	waited := time.Since(start)
	require.ErrorIs(t, err, inbox.ErrInFlight)
	assert.GreaterOrEqual(t, waited, timeout/2)
	assert.Less(t, waited, timeout+5*time.Second)
	release(nil)
	require.NoError(t, <-first)

	_, err = call(mw, b.handler(nil), newMsg("x"))
	require.NoError(t, err)
	require.Equal(t, 1, b.effectCounts(t)["c/x"])

	// The timeout bounds the claim only: a handler statement that waits
	// longer than it for another transaction's lock still succeeds.
	if target.EventIDTime {
		return // the handler's statement below writes the inbox row by its readable id
	}
	release, first = holdClaim(t, b, mw, "y")
	waiting := make(chan struct{})
	handled := make(chan error, 1)
	rollback := errors.New("roll the direct insert back")
	go func() {
		_, err := call(b.middleware(t, inbox.Config{Consumer: "other"}), func(msg *message.Message) ([]*message.Message, error) {
			close(waiting)
			// Blocks on the lock of the held claim of c/y.
			if err := b.exec(msg.Context(), fmt.Sprintf(`INSERT INTO %s (consumer, event_id) VALUES (%s, %s)`,
				b.store.Table(), target.Placeholder(1), target.Placeholder(2)), "c", "y"); err != nil {
				return nil, err
			}
			return nil, rollback
		}, newMsg("z"))
		handled <- err
	}()
	<-waiting
	time.Sleep(2 * timeout)
	boom := errors.New("boom")
	release(boom)
	require.ErrorIs(t, <-first, boom)
	require.ErrorIs(t, <-handled, rollback, "the handler's statement must outlive the claim timeout")
}
