package inbox

import (
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
// The lease is read and renewed by the message that finds it due, before
// its claim, in the message's context: the first message of each consumer
// waits for the first reading (so that a process sees a clash before it
// acks a duplicate), later ones renew it every leaseRenew. Nothing runs
// between messages, so nothing outlives the router.
const (
	leaseTTL   = inboxdriver.LeaseTTL
	leaseRenew = inboxdriver.LeaseRenewal
	// leaseRetry is how soon a renewal that failed (the database out of
	// reach) is tried again; leaseRecheck, one that failed with
	// [inboxdriver.ErrNoLease], which only a migration or a grant mends.
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

	mu     sync.Mutex
	leases map[string]*lease
}

// lease is one consumer's.
type lease struct {
	read     chan struct{} // closed once the first renewal was tried
	due      atomic.Int64  // unix nanoseconds of the next renewal
	renewing atomic.Bool
	sent     atomic.Int64           // the version of the warnings the last renewal carried
	others   atomic.Pointer[string] // the other services with a live lease, "" for none
	renewed  bool                   // a renewal has succeeded; under renewing
}

func newLeaseGuard(d guardDeps) guard {
	r, _ := d.store.(inboxdriver.ConsumerRegistry)
	if r == nil {
		return guardDefaults{}
	}
	return &leaseGuard{registry: r, service: d.config.Service, instance: instanceName(), report: d.report}
}

// beforeClaim reads the consumer's leases before its first claim, renews
// them when due, and warns while another service holds one.
func (g *leaseGuard) beforeClaim(v *visit) error {
	ctx := v.msg.Context()
	l, first := g.lease(v.consumer)
	switch {
	case first:
		g.renew(v, l)
		close(l.read)
	case !g.wait(v, l):
		return nil // cancelled: the claim will say so
	case time.Now().UnixNano() >= l.due.Load() && l.renewing.CompareAndSwap(false, true):
		g.renew(v, l)
	}
	if ctx.Err() != nil {
		return nil
	}
	if others := l.others.Load(); others != nil && *others != "" {
		g.report.warn(observe.SharedConsumer, v.consumer, v.ob,
			fmt.Sprintf("service %q shares consumer %q with %s on this table, so each event runs in only one of them; see docs/wiring.md#consumers", g.service, v.consumer, *others),
			watermill.LogFields{"service": g.service, "others": *others})
	}
	return nil
}

// afterCommit renews the lease at once when the consumer's warnings
// changed, so that the inbox check command sees a warning as soon as it is
// logged.
func (g *leaseGuard) afterCommit(v *visit) {
	g.mu.Lock()
	l := g.leases[v.consumer] // made before the claim
	g.mu.Unlock()
	if l == nil {
		return
	}
	if _, version := g.report.warnings(v.consumer); int64(version) != l.sent.Load() && l.renewing.CompareAndSwap(false, true) {
		g.renew(v, l)
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
func (g *leaseGuard) renew(v *visit, l *lease) {
	defer l.renewing.Store(false)
	// In the message's context: a renewal waits for a connection as its
	// claim would, and the store bounds its statements.
	warnings, version := g.report.warnings(v.consumer)
	others, err := g.registry.Heartbeat(v.msg.Context(), inboxdriver.Heartbeat{
		Consumer: v.consumer, Service: g.service, Instance: g.instance,
		Warnings: warnings, Lease: leaseTTL, First: !l.renewed,
	})
	if err != nil {
		if v.msg.Context().Err() != nil {
			// The message was cancelled (the router closing): nothing
			// is known, and nothing to say.
			return
		}
		wait := leaseRetry
		if errors.Is(err, inboxdriver.ErrNoLease) {
			wait = leaseRecheck
		}
		l.due.Store(time.Now().Add(wait).UnixNano())
		g.report.unchecked(leaseCheck, v.consumer, err)
		return
	}
	l.renewed = true
	l.sent.Store(int64(version))
	joined := strings.Join(others, ", ")
	l.others.Store(&joined)
	l.due.Store(time.Now().Add(leaseRenew).UnixNano())
	g.report.checked(leaseCheck, v.consumer)
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
