package inbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
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
// it claims for, renewed in the background while it claims, and a process
// that finds a live lease of another service on its consumer warns, on
// every message while the other lease lives, and the inbox check command
// fails. A lease ends leaseTTL after its process stopped claiming, so a
// rename or a test is forgotten within a minute.
const (
	leaseTTL   = inboxdriver.LeaseTTL
	leaseRenew = 20 * time.Second
	leaseRetry = time.Minute // after a failed heartbeat
)

// leaseGuard renews this process's leases through the store's
// [inboxdriver.ConsumerRegistry].
type leaseGuard struct {
	registry inboxdriver.ConsumerRegistry // nil: not checked
	instance string

	mu     sync.RWMutex
	leases map[string]*lease
}

// lease is one consumer's.
type lease struct {
	due      atomic.Int64 // unix nanoseconds of the next heartbeat
	beating  atomic.Bool
	first    bool                   // no heartbeat has succeeded yet; under the guard's mu
	others   atomic.Pointer[string] // the other services with a live lease, "" for none
	mu       sync.Mutex
	warnings []string
}

func newLeaseGuard(store inboxdriver.Store) leaseGuard {
	r, _ := store.(inboxdriver.ConsumerRegistry)
	return leaseGuard{registry: r, instance: instanceName()}
}

// beforeClaim starts a heartbeat when one is due, and warns while another
// service holds a lease on the consumer. It never waits for the database.
func (g *leaseGuard) beforeClaim(e *engine, consumer string, ob *observe.Observation) {
	if g.registry == nil {
		return
	}
	l := g.lease(consumer)
	if time.Now().UnixNano() >= l.due.Load() && l.beating.CompareAndSwap(false, true) {
		go g.beat(e, consumer, l)
	}
	if others := l.others.Load(); others != nil && *others != "" {
		e.warn(observe.SharedConsumer, consumer, ob, ErrMiswired,
			fmt.Sprintf("service %q shares consumer %q with %s on this table, so each event runs in only one of them; see docs/wiring.md#consumers", e.config.Service, consumer, *others),
			watermill.LogFields{"service": e.config.Service, "others": *others})
	}
}

func (g *leaseGuard) lease(consumer string) *lease {
	g.mu.RLock()
	l := g.leases[consumer]
	g.mu.RUnlock()
	if l != nil {
		return l
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if l = g.leases[consumer]; l == nil {
		if g.leases == nil {
			g.leases = map[string]*lease{}
		}
		l = &lease{first: true}
		g.leases[consumer] = l
	}
	return l
}

// beat renews the lease, with this process's warnings for the consumer,
// again while warnings arrived during a renewal.
func (g *leaseGuard) beat(e *engine, consumer string, l *lease) {
	defer l.beating.Store(false)
	sent := ""
	for first := true; first || l.pending() != sent; first = false {
		sent = l.pending()
		if !g.renew(e, consumer, l, sent) {
			return
		}
	}
}

// pending is the warnings the lease is to carry.
func (l *lease) pending() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.warnings, ",")
}

func (g *leaseGuard) renew(e *engine, consumer string, l *lease, warnings string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g.mu.RLock()
	first := l.first
	g.mu.RUnlock()
	others, err := g.registry.Heartbeat(ctx, inboxdriver.Heartbeat{
		Consumer: consumer, Service: e.config.Service, Instance: g.instance,
		Warnings: warnings, Lease: leaseTTL, First: first,
	})
	if err != nil {
		l.due.Store(time.Now().Add(leaseRetry).UnixNano())
		e.unchecked("shared consumer", consumer, err)
		return false
	}
	g.mu.Lock()
	l.first = false
	g.mu.Unlock()
	joined := strings.Join(others, ", ")
	l.others.Store(&joined)
	l.due.Store(time.Now().Add(leaseRenew).UnixNano())
	return true
}

// noteWarning records a warning in the consumer's lease, and renews it now
// so that the inbox check command sees it.
func (g *leaseGuard) noteWarning(e *engine, consumer string, w observe.Warning) {
	if g.registry == nil {
		return
	}
	l := g.lease(consumer)
	l.mu.Lock()
	if !slices.Contains(l.warnings, string(w)) {
		l.warnings = append(l.warnings, string(w))
	}
	l.mu.Unlock()
	l.due.Store(0)
	if l.beating.CompareAndSwap(false, true) {
		go g.beat(e, consumer, l)
	}
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
