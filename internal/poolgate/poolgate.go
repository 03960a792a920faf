// Package poolgate keeps a store's claims from taking the last connection of
// its pool. Each claim holds a connection for its whole handler; a handler
// that takes a second connection from the pool (writing through the
// *sql.DB instead of the transaction) would wedge the consumer once every
// connection is held by a claim whose handler waits for another. With the
// last connection left free, one such handler at a time gets it and the
// others follow: the misuse is slow, never a deadlock. A pool of one cannot
// leave one free, and is let through as it is.
//
// The gate belongs to the pool, not to a store: two stores (two tables) on
// one pool each leaving "one" connection free would together leave none.
// [For] hands every store of a pool the same gate.
//
// Work beside the claims (the lease's renewal) takes that free connection,
// one caller at a time ([Gate.Beside]), so that it never holds one a claim
// waits for.
package poolgate

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// gates holds the gate of each pool still in use, by a weak pointer to the
// pool, so that a pool's gate goes with it.
var (
	gatesMu sync.Mutex
	gates   = map[any]*Gate{}
)

// For returns pool's gate (pool is a *sql.DB or a *pgxpool.Pool), the
// same for every caller while pool lives.
func For[P any](pool *P) *Gate {
	k := weak.Make(pool)
	gatesMu.Lock()
	defer gatesMu.Unlock()
	if g := gates[k]; g != nil {
		return g
	}
	g := &Gate{}
	gates[k] = g
	runtime.AddCleanup(pool, func(k weak.Pointer[P]) {
		gatesMu.Lock()
		defer gatesMu.Unlock()
		delete(gates, k)
	}, k)
	return g
}

// Gate counts the connections a store's claims hold, and makes a claim wait,
// without holding a connection, while they hold as many as the limit allows.
// The zero value is ready.
type Gate struct {
	mu      sync.Mutex
	held    int
	waiting []chan struct{} // first come, first served

	// The pool's size, read again at most once per refresh: reading it
	// takes the pool's own lock, which every query takes too.
	size   atomic.Int64
	readAt atomic.Int64 // unix nanoseconds
	// spare holds a token while a caller of [Gate.Beside] holds the
	// connection the claims leave free; made under mu.
	spare chan struct{}
	// giveWay cancels the caller of [Gate.Beside] holding the only place
	// of a pool of one, for a claim come to wait; under mu.
	giveWay func()
}

// refresh is how stale the pool size may be: a pool resized at run time
// (SetMaxOpenConns) is seen within it.
const refresh = time.Second

// Enter waits until the claims hold fewer connections than a pool of the
// size poolSize returns (0 for no limit) lets them, and counts one more. The
// ticket gives the connection back once the claim's transaction has ended.
func (g *Gate) Enter(ctx context.Context, poolSize func() int) (Ticket, error) {
	limit := g.limit(poolSize)
	if limit <= 0 {
		return Ticket{}, nil
	}
	if err := g.enter(ctx, limit); err != nil {
		return Ticket{}, err
	}
	return Ticket{g: g, limit: limit}, nil
}

// Beside waits for a connection for work beside the claims: on a pool of
// two or more, the one the claims leave free, held by one caller at a time,
// so that the claims never wait for it (a handler asking the pool for a
// second connection shares it); on a pool without a limit, nothing. On a
// pool of one, the claims' only place, in their queue, and it gives way:
// the context it returns is cancelled, with the cause
// [inboxdriver.ErrGaveWay], as soon as a claim waits for the place.
func (g *Gate) Beside(ctx context.Context, poolSize func() int) (context.Context, Ticket, error) {
	limit := g.limit(poolSize)
	if limit <= 0 {
		return ctx, Ticket{}, nil
	}
	if g.Size() == 1 {
		t, err := g.Enter(ctx, poolSize)
		if err != nil {
			return ctx, t, err
		}
		ctx, cancel := context.WithCancelCause(ctx)
		t.cancel = cancel
		g.mu.Lock()
		if len(g.waiting) > 0 {
			cancel(inboxdriver.ErrGaveWay)
		} else {
			g.giveWay = func() { cancel(inboxdriver.ErrGaveWay) }
		}
		g.mu.Unlock()
		return ctx, t, nil
	}
	g.mu.Lock()
	if g.spare == nil {
		g.spare = make(chan struct{}, 1)
	}
	spare := g.spare
	g.mu.Unlock()
	select {
	case spare <- struct{}{}:
		return ctx, Ticket{g: g, spare: true}, nil
	case <-ctx.Done():
		return ctx, Ticket{}, ctx.Err()
	}
}

// Size is the pool size the gate last read, 0 for no limit.
func (g *Gate) Size() int { return int(g.size.Load()) }

// Ticket is one claim's place in its [Gate].
type Ticket struct {
	g      *Gate
	limit  int
	spare  bool                    // from [Gate.Beside], on the free connection
	cancel context.CancelCauseFunc // from [Gate.Beside], on a pool of one
}

// Leave gives the place back; later calls do nothing.
func (t *Ticket) Leave() {
	switch {
	case t.g == nil:
	case t.spare:
		<-t.g.spare
	case t.cancel != nil:
		t.g.mu.Lock()
		t.g.giveWay = nil
		t.g.mu.Unlock()
		t.cancel(nil)
		t.g.leave(t.limit)
	default:
		t.g.leave(t.limit)
	}
	t.g = nil
}

// limit is how many connections the claims may hold: all but one, or the
// only one; 0 for a pool without a limit.
func (g *Gate) limit(poolSize func() int) int {
	now := time.Now().UnixNano()
	if at := g.readAt.Load(); at == 0 || now-at > int64(refresh) {
		g.size.Store(int64(poolSize()))
		g.readAt.Store(now)
	}
	n := int(g.size.Load())
	if n <= 0 {
		return 0
	}
	return max(n-1, 1)
}

func (g *Gate) enter(ctx context.Context, limit int) error {
	g.mu.Lock()
	if g.held < limit && len(g.waiting) == 0 {
		g.held++
		g.mu.Unlock()
		return nil
	}
	turn := make(chan struct{})
	g.waiting = append(g.waiting, turn)
	if g.giveWay != nil {
		g.giveWay()
		g.giveWay = nil
	}
	g.mu.Unlock()
	select {
	case <-turn:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		defer g.mu.Unlock()
		for i, w := range g.waiting {
			if w == turn {
				g.waiting = append(g.waiting[:i], g.waiting[i+1:]...)
				return ctx.Err()
			}
		}
		// The turn came with the cancellation: pass it on.
		g.held--
		g.admit(limit)
		return ctx.Err()
	}
}

func (g *Gate) leave(limit int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held--
	g.admit(limit)
}

func (g *Gate) admit(limit int) {
	for g.held < limit && len(g.waiting) > 0 {
		g.held++
		close(g.waiting[0])
		g.waiting = g.waiting[1:]
	}
}
