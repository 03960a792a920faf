package inbox

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/errtext"
	"github.com/watermill-inbox/inbox/internal/session"
	"github.com/watermill-inbox/inbox/observe"
)

// poisonReasonKey is Watermill's middleware.ReasonForPoisonedKey, the
// metadata its PoisonQueue sets on a message it takes, spelled out so that
// the library does not link Watermill's middleware package.
const poisonReasonKey = "reason_poisoned"

// wiringGuard refuses the wirings that are proof of a lost or doubled
// effect: the inbox wrapping itself, one event reaching two handler names
// that share a fixed consumer, a handler called twice in one transaction, a
// PoisonQueue inside the inbox.
type wiringGuard struct {
	guardDefaults
	consumer     string // Config.Consumer
	share        bool   // Config.ShareConsumer
	logger       watermill.LoggerAdapter
	report       *reporter
	fixedHandler atomic.Pointer[string] // the first handler name seen with a fixed Consumer
	fixed        receivedBy
	workers      workers
}

// receivedBy remembers, under a fixed [Config.Consumer], which handler name
// received each of the last fixedEvents events. Two handler names on
// disjoint topics share the consumer harmlessly; an event that reaches both
// is proof that one of them would ack it unprocessed, as the other's
// duplicate. An event older than the memory, or received in another
// process, goes unseen: the suspicion warning covers it.
type receivedBy struct {
	mu      sync.Mutex
	handler map[string]string // event id -> handler name
	ids     []string          // the keys of handler, a ring, oldest at next
	next    int
}

// fixedEvents bounds receivedBy's memory: about 100 bytes an event.
const fixedEvents = 4096

// record notes that handler received eventID and returns the handler
// name that received it first.
func (r *receivedBy) record(eventID, handler string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if first, ok := r.handler[eventID]; ok {
		return first
	}
	if r.handler == nil {
		r.handler = map[string]string{}
	}
	if len(r.ids) < fixedEvents {
		r.ids = append(r.ids, eventID)
	} else {
		delete(r.handler, r.ids[r.next])
		r.ids[r.next] = eventID
		r.next = (r.next + 1) % fixedEvents
	}
	r.handler[eventID] = handler
	return handler
}

func newWiringGuard(d guardDeps) guard {
	return &wiringGuard{consumer: d.config.Consumer, share: d.config.ShareConsumer, logger: d.config.Logger, report: d.report}
}

// beforeClaim refuses, before any SQL, a message the middleware would
// handle wrongly because of how it is wired.
func (g *wiringGuard) beforeClaim(v *visit) error {
	msg, consumer := v.msg, v.consumer
	// The same message already inside a session: the inner claim would
	// wait forever on the outer one's row lock, or, under another consumer
	// name, commit apart from it.
	if outer := session.From(msg.Context()); outer != nil && outer.Msg == msg {
		return fmt.Errorf("%w: the inbox wraps this handler twice (consumer %q): keep one of router.AddMiddleware and inbox.Handler", ErrMiswired, outer.Consumer)
	}
	name := message.HandlerNameFromCtx(msg.Context())
	if name == "" {
		return nil
	}
	key, ok := handlerKey(msg.Context(), v.handler)
	if g.consumer == "" {
		if ok {
			if group := g.workers.see(name, key); len(group) > 1 {
				return g.unshared(v, key, group)
			}
		}
		return nil
	}
	if g.share {
		return nil
	}
	if ok {
		g.workers.see(name, key)
	}
	if first := g.fixed.record(v.eventID, name); first != name && !g.workers.same(first, name) {
		return fmt.Errorf("%w: event %s reached handlers %q and %q, which share the fixed consumer %q, so it would run in one only; see docs/wiring.md#consumers", ErrMiswired, errtext.Quote(v.eventID), first, name, consumer)
	}
	first := g.fixedHandler.Load()
	if first == nil {
		claimed := name // only this copy escapes: no allocation per message
		g.fixedHandler.CompareAndSwap(nil, &claimed)
		first = g.fixedHandler.Load()
	}
	if *first != name && !g.workers.same(*first, name) {
		g.report.warn(observe.SharedConsumer, consumer, v.ob,
			"two handler names share the fixed consumer: an event reaching both runs in one only, and is refused when seen; give each its own Consumer, or set ShareConsumer",
			watermill.LogFields{"handlers": *first + ", " + name})
	}
	return nil
}

// unshared refuses, until the wiring changes, a message of a handler name
// whose function runs under other names on the same topic: workers of one
// queue, which the default consumer (each name) would make consumers of
// their own, each running the copies of an event that reach it. No default
// can join them safely: the claims already stored are under each name, and
// another replica may see the names in another order. The refusal is
// transient, for the broker to keep the message.
func (g *wiringGuard) unshared(v *visit, key workerKey, group []string) error {
	v.ob.Outcome = observe.Miswired
	err := Transient(fmt.Errorf("%w: %d handler names run one function on topic %s; use inbox.Subscriptions, or Consumer with ShareConsumer (docs/wiring.md#workers)",
		errUnsharedWorkers, len(group), errtext.Quote(key.topic)))
	if g.report.first("workers", fmt.Sprintf("%s\x00%x", key.topic, key.handler)) {
		g.logger.Error("Inbox: message refused, kept in the broker: workers of one queue claim as separate consumers and would double effects", err, watermill.LogFields{
			"handlers": strings.Join(group, ", "), "topic": key.topic,
		})
	}
	return err
}

// errUnsharedWorkers is the transient refusal of [wiringGuard.unshared].
var errUnsharedWorkers = errors.New("inbox: workers of one queue claim as separate consumers")

// afterHandler looks, after the handler chain returned success, for
// middlewares inside the inbox that repeated or swallowed a handler call.
func (g *wiringGuard) afterHandler(v *visit) error {
	s := v.s
	if n := s.Calls(); n > 1 {
		return errCalledTwice(s, n)
	}
	// PoisonQueue inside the inbox turned the handler's error into a
	// success: committing would keep the failed attempt's writes and the
	// claim, and the event could never be replayed from the poison queue.
	// Rolling back instead is what PoisonQueue outside the inbox does.
	if reason := s.Msg.Metadata.Get(poisonReasonKey); reason != "" && reason != v.poisoned {
		v.ob.Outcome = observe.Miswired
		g.logger.Error("Inbox: a PoisonQueue inside the inbox took this message: rolled back and acked; put PoisonQueue outside the inbox", ErrMiswired, watermill.LogFields{
			"consumer": s.Consumer, "event_id": s.EventID, "message_uuid": s.Msg.UUID, "reason_poisoned": reason,
		})
		return errAck
	}
	return nil
}

// errCalledTwice is the error of a session whose handler was called n times:
// a middleware between the inbox and the handler repeats calls, and their
// writes would all commit together.
func errCalledTwice(s *session.Session, n int32) error {
	return fmt.Errorf("%w: the handler ran %d times in one inbox transaction (consumer %q, event %s): a Retry or Duplicator sits inside the inbox", ErrMiswired, n, s.Consumer, errtext.Quote(s.EventID))
}
