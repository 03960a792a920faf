package inbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/observe"
)

// Two services whose handlers share a name on one inbox table share one
// claim per event, so each event runs in only one of them. Which service a
// process belongs to is a guess (the main package path, unless
// [Config.Service] says), and a guess can be wrong (a renamed package, an
// integration test run against the service's database), so this is a
// warning and never a refusal: every process holds a lease on each consumer
// it claims for, and a process that finds a live lease of another service
// on its consumer warns, on every message while the other lease lives, and
// the inbox check command reports it. A lease ends leaseTTL after its
// process stopped claiming, so a rename or a test is forgotten within a
// minute.
//
// The first message of each consumer reads the lease before its claim (so
// that a process sees a clash before it acks a duplicate). Later renewals
// never sit in a message's path: the message that finds one due starts it
// beside itself, in a goroutine with a context of its own, one at a time
// per consumer, on the connection the claims leave free (one renewal of
// the pool at a time), its statements bounded by leaseTimeout. So a lease
// table locked by an operator or missing costs the messages nothing, and
// the goroutine ends within leaseTimeout of getting its connection, whether
// or not the router still runs.
const (
	leaseTTL   = inboxdriver.LeaseTTL
	leaseRenew = inboxdriver.LeaseRenewal
	// leaseTimeout bounds a renewal's statements.
	leaseTimeout = 5 * time.Second
	// leaseRetry is how soon a renewal that failed (the database out of
	// reach, the table locked) is tried again; leaseRecheck, one that
	// failed with [inboxdriver.ErrNoLease], which only a migration or a
	// grant mends.
	leaseRetry   = 5 * time.Second
	leaseRecheck = time.Hour
)

// leaseCheck names the lease's check in logs and warnings.
const leaseCheck = "shared consumer"

// leaseGuard renews this process's leases through the store's
// [inboxdriver.ConsumerRegistry].
type leaseGuard struct {
	guardDefaults
	registry inboxdriver.ConsumerRegistry // nil: not checked
	service  string
	instance string
	report   *reporter
	now      func() time.Time // time.Now; tests move it
	timeout  time.Duration    // leaseTimeout; tests lengthen it

	mu     sync.Mutex
	leases map[string]*lease
}

// lease is one consumer's.
type lease struct {
	read     chan struct{} // closed once the first renewal was tried
	due      atomic.Int64  // unix nanoseconds of the next renewal
	renewing atomic.Bool
	// live: the last renewal succeeded, so a change of the warnings is
	// carried at once; after a failure the next try waits for due.
	live    atomic.Bool
	sent    atomic.Int64           // the version of the warnings the last renewal carried
	others  atomic.Pointer[string] // the other services with a live lease, "" for none
	renewed bool                   // a renewal has succeeded; under renewing
}

func newLeaseGuard(d guardDeps) guard {
	r, _ := d.store.(inboxdriver.ConsumerRegistry)
	if r == nil {
		return guardDefaults{}
	}
	return &leaseGuard{registry: r, service: d.config.Service, instance: instanceName(), report: d.report, now: time.Now, timeout: leaseTimeout}
}

// beforeClaim reads the consumer's leases before its first claim, starts
// their renewal when due, and warns while another service holds one.
func (g *leaseGuard) beforeClaim(v *visit) error {
	l, first := g.lease(v.consumer)
	switch {
	case first:
		g.renew(v.msg.Context(), v.consumer, l)
		close(l.read)
	case !g.wait(v, l):
		return nil // cancelled: the claim will say so
	case g.now().UnixNano() >= l.due.Load():
		g.start(v.consumer, l)
	}
	if others := l.others.Load(); others != nil && *others != "" {
		g.report.warn(observe.SharedConsumer, v.consumer, v.ob,
			fmt.Sprintf("service %q shares consumer %q with %s on this table, so each event runs in only one of them; see docs/wiring.md#consumers", g.service, v.consumer, *others),
			watermill.LogFields{"service": g.service, "others": *others})
	}
	return nil
}

// afterCommit renews a live lease at once when the consumer's warnings
// changed, so that the inbox check command sees a warning as soon as it is
// logged.
func (g *leaseGuard) afterCommit(v *visit) {
	g.mu.Lock()
	l := g.leases[v.consumer] // made before the claim
	g.mu.Unlock()
	if l == nil || !l.live.Load() {
		return
	}
	if _, version := g.report.warnings(v.consumer); int64(version) != l.sent.Load() {
		g.start(v.consumer, l)
	}
}

// start renews l beside the message, unless a renewal is under way.
func (g *leaseGuard) start(consumer string, l *lease) {
	if l.renewing.CompareAndSwap(false, true) {
		go g.renew(context.Background(), consumer, l)
	}
}

// lease is consumer's lease; first is true for the caller that made it,
// which then holds its renewal.
func (g *leaseGuard) lease(consumer string) (l *lease, first bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if l = g.leases[consumer]; l != nil {
		return l, false
	}
	if g.leases == nil {
		g.leases = map[string]*lease{}
	}
	l = &lease{read: make(chan struct{})}
	l.renewing.Store(true)
	g.leases[consumer] = l
	return l, true
}

// wait waits for the first renewal of l, which another message of the
// consumer is making; false when the message was cancelled first.
func (g *leaseGuard) wait(v *visit, l *lease) bool {
	select {
	case <-l.read:
		return true
	default:
	}
	select {
	case <-l.read:
		return true
	case <-v.msg.Context().Done():
		return false
	}
}

// renew renews l with the consumer's warnings, and lets go of its renewal.
// ctx is the first message's, which waits for the first reading as for its
// claim; a later renewal's own, so that a message that ends or is cancelled
// leaves it be.
func (g *leaseGuard) renew(ctx context.Context, consumer string, l *lease) {
	defer l.renewing.Store(false)
	warnings, version := g.report.warnings(consumer)
	others, err := g.registry.Heartbeat(ctx, inboxdriver.Heartbeat{
		Consumer: consumer, Service: g.service, Instance: g.instance,
		Warnings: warnings, Lease: leaseTTL, First: !l.renewed, Timeout: g.timeout,
	})
	if err != nil {
		if ctx.Err() != nil {
			// The first message was cancelled (the router closing):
			// nothing is known, and nothing to say.
			return
		}
		wait := leaseRetry
		if errors.Is(err, inboxdriver.ErrGaveWay) {
			// A claim needed the connection: nothing is known.
			l.due.Store(g.now().Add(wait).UnixNano())
			return
		}
		if errors.Is(err, inboxdriver.ErrNoLease) {
			wait = leaseRecheck
		}
		l.live.Store(false)
		l.due.Store(g.now().Add(wait).UnixNano())
		g.report.unchecked(leaseCheck, consumer, err)
		return
	}
	l.renewed = true
	l.sent.Store(int64(version))
	joined := strings.Join(others, ", ")
	l.others.Store(&joined)
	l.due.Store(g.now().Add(leaseRenew).UnixNano())
	l.live.Store(true)
	g.report.checked(leaseCheck, consumer)
}

// instanceName tells this process from the others of its service in the
// inbox check command's report: host, process id, and a random suffix.
func instanceName() string {
	host, _ := os.Hostname()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
	if len(name) > maxNameLength {
		name = name[len(name)-maxNameLength:]
	}
	return name
}

// unknownService is the main package path of a binary built from files (go
// run main.go) rather than from a package: every such binary has it.
const unknownService = "command-line-arguments"

// defaultService is the main package path of the running binary, or its
// module's for a binary built from files.
func defaultService() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return unknownService
	}
	name := info.Path
	if name == unknownService && info.Main.Path != "" {
		name = info.Main.Path + " (" + unknownService + ")"
	}
	if validateName("service name", name) != nil {
		return unknownService
	}
	return name
}
