package galera_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/dbserver"
	"github.com/watermill-inbox/inbox/internal/testing/stream"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The stream of the race: every event delivered once to each node at the
// same moment, to workers of each node.
const (
	raceEvents     = 1500
	workersPerNode = 3
)

// conflictKind is where a certification conflict surfaced.
type conflictKind int

const (
	onRegistration conflictKind = iota // the consumer's registration, before a node's first claim
	onClaim                            // the claim's INSERT
	onHandler                          // the handler's own statement, after the claim succeeded
	atCommit                           // COMMIT
	kinds
)

func (k conflictKind) String() string {
	return [...]string{"on the consumer's registration", "on the claim", "on the handler's statements", "at COMMIT"}[k]
}

// race counts what the workers saw.
type race struct {
	attempts, processed, duplicates, nodeDown atomic.Int64
	commitUnknown                             atomic.Int64        // of nodeDown: COMMIT failed, its outcome unknown to the client
	conflicts, inFlight                       [kinds]atomic.Int64 // inFlight: of those, the error the user got wraps inbox.ErrInFlight

	mu          sync.Mutex
	handlerRuns map[string]int
	afterCommit map[string]int
	unexpected  []string
}

func (r *race) count(m map[string]int, id string) {
	r.mu.Lock()
	m[id]++
	r.mu.Unlock()
}

func (r *race) unexpectedErr(node string, ob observe.Observation, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.unexpected) < 10 {
		r.unexpected = append(r.unexpected, fmt.Sprintf("node %s, outcome %s: %v", node, ob.Outcome, err))
	}
}

// attempt carries one attempt's observation and what its handler saw from
// the observer and the handler back to the worker.
type attempt struct {
	ob              observe.Observation
	handlerConflict bool // the handler's statement failed with a conflict
	handlerDone     bool // the handler returned nil: what failed after it was the commit
}

type attemptKey struct{}

// observer hands each attempt's observation to the worker that made it.
type observer struct{}

func (observer) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	return ctx, func(ob observe.Observation) {
		if a != nil {
			a.ob = ob
		}
	}
}

// certificationConflict reports whether err is MariaDB's 1213, which a
// Galera node returns when another node's write set won certification.
func certificationConflict(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1213
}

// node is one Galera node, the workers' inbox on it, and when it was
// down: from its kill until its workers' first success after its restart.
type node struct {
	db      *dbserver.GaleraNode
	target  *stream.Target
	store   *sqlinbox.Store
	handle  message.HandlerFunc
	queue   chan string
	killed  atomic.Bool   // set at the kill, for good
	down    atomic.Bool   // from the kill until the restarted node is synced
	resumed chan struct{} // closed at its workers' first success after the restart
	once    sync.Once
}

// A Galera cluster with every event delivered to its three nodes at once,
// while one node is SIGKILLed and restarted mid-stream: every event has
// exactly one effect, though the handler ran on each node that raced, and
// its AfterCommit hook ran at most once (never for a commit whose answer
// died with its node); every conflict, wherever it surfaced, was a failed
// attempt the next one resolved (as a duplicate).
func testNodeKilled(t *testing.T, cluster *dbserver.Galera) {
	t0 := time.Now()
	tables := stream.NewTables()
	r := &race{handlerRuns: map[string]int{}, afterCommit: map[string]int{}}
	var nodes []*node
	for _, n := range cluster.Nodes {
		nd := &node{db: n, target: stream.Open(t, "mysql", n.DSN(), tables, 2*workersPerNode),
			queue: make(chan string, raceEvents), resumed: make(chan struct{})}
		nd.store = nd.target.Store.(*sqlinbox.Store)
		mw, err := inbox.NewMiddleware(inbox.Config{Store: nd.store, Consumer: stream.Consumer, Observer: observer{}})
		require.NoError(t, err)
		nd.handle = mw(r.handler(nd))
		nodes = append(nodes, nd)
	}
	nodes[0].target.CreateTables(t)

	var wg sync.WaitGroup
	failed := make(chan error, 1)
	for _, nd := range nodes {
		for range workersPerNode {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for id := range nd.queue {
					if err := r.deliver(nd, id); err != nil {
						select {
						case failed <- err:
						default:
						}
						return
					}
				}
			}()
		}
	}
	for i := range raceEvents {
		for _, nd := range nodes {
			nd.queue <- stream.EventID(i)
		}
	}
	for _, nd := range nodes {
		close(nd.queue)
	}

	// Mid-stream, the last node dies and comes back.
	require.Eventually(t, func() bool { return r.processed.Load() >= raceEvents/3 }, time.Minute, 5*time.Millisecond)
	victim := nodes[2]
	victim.killed.Store(true)
	victim.down.Store(true)
	killed := cluster.Kill(t, victim.db)
	evicted := cluster.WaitEvicted(t, victim.db, killed)
	cluster.Restart(t, victim.db)
	rejoined := time.Since(killed)
	victim.down.Store(false)
	ist := victim.db.IncrementalTransfer()

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case err := <-failed:
		t.Fatal(err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the workers did not finish in 2 minutes")
	}
	select {
	case err := <-failed:
		t.Fatal(err)
	default:
	}
	took := time.Since(t0)

	// The verdict, read with causality checks on: a node answers only once
	// it applied every write set the cluster committed before.
	check := stream.Open(t, "mysql", cluster.Nodes[0].DSN()+"?wsrep_sync_wait=1", tables, 1)
	verdict := stream.Check(t, check, raceEvents)

	r.mu.Lock()
	runs, lost, hooks, hookTwice := 0, 0, len(r.afterCommit), 0
	for _, n := range r.handlerRuns {
		runs += n
		lost += n - 1
	}
	for _, n := range r.afterCommit {
		if n != 1 {
			hookTwice++
		}
	}
	unexpected := r.unexpected
	r.mu.Unlock()
	conflicts := int64(0)
	report := fmt.Sprintf("%d events, %d deliveries (each event to %d nodes at once, %d workers per node), %d attempts in %s: "+
		"%d committed, %d duplicates skipped; the handler ran %d times (%d runs lost their race at COMMIT or before), AfterCommit ran for %d events; "+
		"%s; 1 node killed, evicted by the others %s later, synced again %s after the kill (incremental state transfer: %t), %d attempts failed while it was down (%d at COMMIT, whose outcome the client could not know); certification conflicts:",
		raceEvents, raceEvents*len(nodes), len(nodes), workersPerNode, r.attempts.Load(), took.Round(10*time.Millisecond),
		r.processed.Load(), r.duplicates.Load(), runs, lost, hooks, verdict, evicted.Round(10*time.Millisecond), rejoined.Round(10*time.Millisecond), ist, r.nodeDown.Load(), r.commitUnknown.Load())
	var byKind []string
	for k := range kinds {
		conflicts += r.conflicts[k].Load()
		byKind = append(byKind, fmt.Sprintf("%d %s (%d wrapped inbox.ErrInFlight)", r.conflicts[k].Load(), k, r.inFlight[k].Load()))
	}
	report += " " + strings.Join(byKind, ", ")
	t.Log(report)

	require.Empty(t, unexpected, "errors neither a conflict nor the killed node's")
	verdict.RequireExactlyOnce(t)
	// AfterCommit runs once per commit the client saw succeed: never twice,
	// and not for an event whose COMMIT reached the cluster while its
	// node died before answering (the redelivery finds it a duplicate).
	require.Zero(t, hookTwice, "events whose AfterCommit hook ran more than once")
	require.EqualValues(t, hooks, r.processed.Load(), "events whose AfterCommit hook ran, beside the commits that succeeded")
	require.LessOrEqual(t, int64(raceEvents-hooks), r.commitUnknown.Load(), "events without an AfterCommit run, beside the commits whose outcome was lost")
	require.Positive(t, conflicts, "no copies raced: the test did not exercise certification")
	for k := onClaim; k < kinds; k++ { // on the claim, the handler's statements or COMMIT: the claim's race, retried
		require.Equal(t, r.conflicts[k].Load(), r.inFlight[k].Load(), "conflicts %s that reached the user as inbox.ErrInFlight", k)
	}
}

// handler writes the event's effect in the inbox transaction, registers an
// after-commit hook, and counts both.
func (r *race) handler(nd *node) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		id, _, _ := inbox.EventIDFromContext(ctx)
		r.count(r.handlerRuns, id)
		if err := nd.target.WriteEffect(ctx, id); err != nil {
			if a, ok := ctx.Value(attemptKey{}).(*attempt); ok && certificationConflict(err) {
				a.handlerConflict = true
			}
			return nil, err
		}
		err := inbox.AfterCommit(ctx, func(context.Context) error {
			r.count(r.afterCommit, id)
			return nil
		})
		if a, ok := ctx.Value(attemptKey{}).(*attempt); ok && err == nil {
			a.handlerDone = true
		}
		return nil, err
	}
}

// deliver hands event id to node nd's inbox until an attempt succeeds, as
// a broker redelivers a nacked message: each attempt a new message with the
// event's id, after a backoff.
func (r *race) deliver(nd *node, id string) error {
	backoff := 5 * time.Millisecond
	deadline := time.Now().Add(time.Minute)
	for {
		a := &attempt{}
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set("event_id", id)
		msg.SetContext(context.WithValue(context.Background(), attemptKey{}, a))
		r.attempts.Add(1)
		_, err := nd.handle(msg)
		if err == nil {
			switch a.ob.Outcome {
			case observe.Processed:
				r.processed.Add(1)
			case observe.Duplicate:
				r.duplicates.Add(1)
			}
			if nd.killed.Load() && !nd.down.Load() {
				nd.once.Do(func() { close(nd.resumed) })
			}
			return nil
		}
		r.classify(nd, a, err)
		if time.Now().After(deadline) {
			return fmt.Errorf("event %s on node %s still failing after a minute: %w", id, nd.db.Name, err)
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// classify counts a failed attempt by where it failed.
func (r *race) classify(nd *node, a *attempt, err error) {
	// Where it failed is what the attempt saw, not the outcome's name.
	kind := kinds
	conflict := certificationConflict(err) || errors.Is(err, inbox.ErrInFlight)
	if certificationConflict(err) && !nd.store.IsConflict(err) {
		r.unexpectedErr(nd.db.Name, a.ob, fmt.Errorf("the store does not call it a conflict: %w", err))
	}
	switch {
	case a.handlerConflict:
		kind = onHandler
	case !conflict:
	case a.handlerDone:
		kind = atCommit
	case a.ob.Outcome == observe.ClaimFailed:
		kind = onRegistration
	default:
		kind = onClaim
	}
	if kind != kinds {
		r.conflicts[kind].Add(1)
		if errors.Is(err, inbox.ErrInFlight) {
			r.inFlight[kind].Add(1)
		}
		return
	}
	if nd.killed.Load() && !closed(nd.resumed) {
		r.nodeDown.Add(1)
		if a.handlerDone {
			r.commitUnknown.Add(1)
		}
		return
	}
	r.unexpectedErr(nd.db.Name, a.ob, err)
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
