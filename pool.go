package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/internal/errtext"
)

// ClaimPool is implemented by stores whose claims hold a connection of a
// bounded pool for the whole handler ([sqlinbox.Store] and
// [pgxinbox.Store]). The middleware then never lets its claims, those of
// every middleware on the same pool together, take the pool's last
// connection: a handler that takes a second connection from the pool
// (writing through the [*sql.DB] instead of the transaction) would otherwise
// wedge the consumer once every connection is held by a claim whose
// handler waits for another, and a duplicate waiting for its original's
// row lock holds one more. With the last connection left free, one such
// handler at a time gets it, and the others follow.
//
// A pool of one connection cannot leave one free. When the store counts
// the callers waiting for a connection (waits at least 0), a handler that
// holds that only connection while a caller waits for it, for at least
// [PoolWaitTimeout], is cancelled and its message refused with
// [ErrMiswired], since the waiter is most likely the handler itself.
//
// [sqlinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/sqlinbox#Store
// [pgxinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#Store
type ClaimPool interface {
	// ClaimPool returns the pool the claims draw their connections from
	// (a comparable value that tells pools apart: the [*sql.DB], the
	// *pgxpool.Pool), the most connections it opens (0 for no limit), and
	// how many callers have waited for a connection so far (-1 when the
	// pool does not count them). The middleware calls it for every
	// message.
	ClaimPool() (pool any, maxConns int, waits int64)
}

// PoolWaitTimeout is how long a handler may hold the only connection of a
// pool of one while another caller waits for it (see [ClaimPool]): the
// pool is looked at every PoolWaitTimeout, and the handler cancelled when
// a caller was already waiting at the previous look.
const PoolWaitTimeout = 3 * time.Second

// gates holds one gate per pool, shared by every middleware on it.
var gates sync.Map // pool -> *gate

// gate counts the connections a pool's claims hold, and makes a claim
// wait, without holding a connection, while they hold as many as its
// limit allows.
type gate struct {
	mu      sync.Mutex
	held    int
	waiting []chan struct{} // first come, first served
}

func gateFor(pool any) *gate {
	if g, ok := gates.Load(pool); ok {
		return g.(*gate)
	}
	g, _ := gates.LoadOrStore(pool, &gate{})
	return g.(*gate)
}

// limit is how many connections of a pool of maxConns the claims may
// hold: all but one, or the only one.
func limit(maxConns int) int { return max(maxConns-1, 1) }

// enter waits until the claims hold fewer than limit connections, then
// counts one more.
func (g *gate) enter(ctx context.Context, limit int) error {
	g.mu.Lock()
	if g.held < limit && len(g.waiting) == 0 {
		g.held++
		g.mu.Unlock()
		return nil
	}
	turn := make(chan struct{})
	g.waiting = append(g.waiting, turn)
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

// leave counts one connection less and lets the next claims in.
func (g *gate) leave(limit int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held--
	g.admit(limit)
}

func (g *gate) admit(limit int) {
	for g.held < limit && len(g.waiting) > 0 {
		g.held++
		close(g.waiting[0])
		g.waiting = g.waiting[1:]
	}
}

// poolUse is one message's place in its pool's gate.
type poolUse struct {
	g        *gate
	limit    int
	maxConns int
	waits    int64 // the pool's waits when the claim was made; -1 unknown
	left     bool
}

// enterPool takes the message's place in the gate of the store's pool;
// the zero poolUse when the store's pool has no limit.
func (e *engine) enterPool(ctx context.Context) (poolUse, error) {
	if e.pool == nil {
		return poolUse{}, nil
	}
	pool, maxConns, waits := e.pool.ClaimPool()
	if maxConns <= 0 {
		return poolUse{}, nil
	}
	u := poolUse{g: gateFor(pool), limit: limit(maxConns), maxConns: maxConns, waits: waits}
	if err := u.g.enter(ctx, u.limit); err != nil {
		return poolUse{}, fmt.Errorf("inbox: waiting for a connection of the pool (every connection but one is held by claims): %w", err)
	}
	return u, nil
}

// leave gives the message's place back, once.
func (u *poolUse) leave() {
	if u.g != nil && !u.left {
		u.left = true
		u.g.leave(u.limit)
	}
}

// errPoolWait is the cause of a handler context cancelled by watchPool.
var errPoolWait = errors.New("inbox: the handler held the pool's only connection while a caller waited for one")

// watchPool cancels ctx when, on a pool of one connection the handler's
// transaction holds, a caller has waited for a connection for at least
// [PoolWaitTimeout]: the handler asking for a second one waits for itself.
// At one connection, a caller that began waiting after the claim is still
// waiting, unless it gave up: only the end of this transaction can serve
// it.
// It returns the handler's context and the function that stops watching.
func (e *engine) watchPool(ctx context.Context, u poolUse) (context.Context, func()) {
	if u.maxConns != 1 || u.waits < 0 {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	var (
		mu      sync.Mutex
		stopped bool
		timer   *time.Timer
	)
	seen := u.waits // the waits counted at the previous check
	var check func()
	check = func() {
		_, _, waits := e.pool.ClaimPool()
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if seen > u.waits { // a caller began waiting before the last check
			cancel(errPoolWait)
			return
		}
		seen = waits
		timer = time.AfterFunc(PoolWaitTimeout, check)
	}
	timer = time.AfterFunc(PoolWaitTimeout, check)
	return ctx, func() {
		mu.Lock()
		stopped = true
		timer.Stop()
		mu.Unlock()
		cancel(nil)
	}
}

// poolWaitErr is the message's error when watchPool cancelled its
// handler; logged once per consumer.
func (e *engine) poolWaitErr(s *session, handlerErr error) error {
	err := fmt.Errorf("%w: the handler of event %s held the only connection of its pool (a pool of one, such as SetMaxOpenConns(1)) while another caller waited for one, for %s or more: most likely the handler itself asking the pool for a second connection, which waits for its own transaction forever. It was cancelled and its transaction rolled back. Write through inbox.TxFromContext (pgxinbox.TxFromContext), never the pool, and give the pool at least two connections: the inbox leaves one free (handler: %w)", ErrMiswired, errtext.Quote(s.eventID), PoolWaitTimeout, handlerErr)
	e.poolWaitMu.Lock()
	defer e.poolWaitMu.Unlock()
	if !e.poolWaitLogged[s.consumer] {
		if e.poolWaitLogged == nil {
			e.poolWaitLogged = map[string]bool{}
		}
		e.poolWaitLogged[s.consumer] = true
		e.config.Logger.Error("Inbox: a handler held the pool's only connection while another caller waited for one; logged once per consumer", err, watermill.LogFields{
			"consumer": s.consumer, "event_id": s.eventID, "message_uuid": s.msg.UUID,
		})
	}
	return err
}
