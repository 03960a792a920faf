package inbox

import (
	"fmt"
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
// effect: the inbox wrapping itself, one fixed consumer reached from two
// handler names, a handler called twice in one transaction, a PoisonQueue
// inside the inbox.
type wiringGuard struct {
	guardDefaults
	consumer     string // Config.Consumer
	share        bool   // Config.ShareConsumer
	logger       watermill.LoggerAdapter
	fixedHandler atomic.Pointer[string] // the first handler name seen with a fixed Consumer
}

func newWiringGuard(d guardDeps) guard {
	return &wiringGuard{consumer: d.config.Consumer, share: d.config.ShareConsumer, logger: d.config.Logger}
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
	if g.consumer == "" || g.share {
		return nil
	}
	name := message.HandlerNameFromCtx(msg.Context())
	if name == "" {
		return nil
	}
	first := g.fixedHandler.Load()
	if first == nil {
		claimed := name // only this copy escapes: no allocation per message
		g.fixedHandler.CompareAndSwap(nil, &claimed)
		first = g.fixedHandler.Load()
	}
	if *first != name {
		// Each event would run in only one of the two handlers.
		return fmt.Errorf("%w: handlers %q and %q share the fixed consumer %q, so each event runs in one of them; see docs/wiring.md#consumers", ErrMiswired, *first, name, consumer)
	}
	return nil
}

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
