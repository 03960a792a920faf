package poolgate

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

func size(n int) func() int { return func() int { return n } }

// entered reports whether enter returned within a short wait; a false is
// only ever confirmed by the later release that lets it in.
func entered(t *testing.T, enter func(ctx context.Context) (Ticket, error)) (func() bool, <-chan Ticket) {
	t.Helper()
	got := make(chan Ticket, 1)
	go func() {
		ticket, err := enter(context.Background())
		if err != nil {
			t.Errorf("enter: %v", err)
		}
		got <- ticket
	}()
	return func() bool {
		select {
		case ticket := <-got:
			got <- ticket
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	}, got
}

// On a pool of two, work beside the claims takes the free connection: the
// claim's place stays open, and a second caller beside waits for the first.
func TestBesideTakesTheFreeConnection(t *testing.T) {
	t.Parallel()
	g := &Gate{}
	_, beside, err := g.Beside(context.Background(), size(2))
	require.NoError(t, err)
	claim, err := g.Enter(context.Background(), size(2))
	require.NoError(t, err, "the claims' place is not taken by the work beside them")

	in, second := entered(t, func(ctx context.Context) (Ticket, error) { _, t, err := g.Beside(ctx, size(2)); return t, err })
	require.False(t, in(), "one caller beside at a time")
	beside.Leave()
	ticket := <-second
	ticket.Leave()
	claim.Leave()

	ctx, cancel := context.WithCancel(context.Background())
	_, held, err := g.Beside(ctx, size(2))
	require.NoError(t, err)
	cancel()
	_, _, err = g.Beside(ctx, size(2))
	require.ErrorIs(t, err, context.Canceled, "a cancelled wait gives up")
	held.Leave()
	_, again, err := g.Beside(context.Background(), size(2))
	require.NoError(t, err, "the place was given back")
	again.Leave()
}

// On a pool of one, work beside the claims waits in their queue, and gives
// way as soon as a claim comes to wait; on a pool without a limit, it never
// waits.
func TestBesideOnAPoolOfOneGivesWay(t *testing.T) {
	t.Parallel()
	g := &Gate{}
	claim, err := g.Enter(context.Background(), size(1))
	require.NoError(t, err)
	var besideCtx context.Context
	in, beside := entered(t, func(ctx context.Context) (Ticket, error) {
		c, t, err := g.Beside(ctx, size(1))
		besideCtx = c
		return t, err
	})
	require.False(t, in(), "behind the claim holding the only connection")
	claim.Leave()
	ticket := <-beside
	require.NoError(t, besideCtx.Err(), "nobody waits")

	in, next := entered(t, func(ctx context.Context) (Ticket, error) { return g.Enter(ctx, size(1)) })
	<-besideCtx.Done()
	require.ErrorIs(t, context.Cause(besideCtx), inboxdriver.ErrGaveWay, "a claim came to wait")
	require.False(t, in(), "until the work beside leaves")
	ticket.Leave()
	claim = <-next
	claim.Leave()

	unlimited := &Gate{}
	for range 3 {
		ctx, _, err := unlimited.Beside(context.Background(), size(0))
		require.NoError(t, err)
		require.NoError(t, ctx.Err())
	}
}
