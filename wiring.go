package inbox

import (
	"fmt"
	"path"
	"reflect"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// poisonReasonKey is Watermill's [middleware.ReasonForPoisonedKey], the
// metadata [PoisonQueue] sets on a message it takes. Spelled out so that the
// library does not link Watermill's middleware package.
//
// [middleware.ReasonForPoisonedKey]: https://pkg.go.dev/github.com/ThreeDotsLabs/watermill/message/router/middleware#ReasonForPoisonedKey
// [PoisonQueue]: https://pkg.go.dev/github.com/ThreeDotsLabs/watermill/message/router/middleware#PoisonQueue
const poisonReasonKey = "reason_poisoned"

// checkWiring refuses, before any SQL, a message the middleware would handle
// wrongly because of how it is wired.
func (e *engine) checkWiring(msg *message.Message, consumer string) error {
	// The same message already inside a session: the middleware wraps
	// itself. The inner claim would wait forever on the outer one's row
	// lock, or, under another consumer name, commit apart from it.
	if outer := sessionFrom(msg.Context()); outer != nil && outer.msg == msg {
		return fmt.Errorf("%w: the message is already inside an inbox transaction (consumer %q): the inbox middleware is applied twice, for example with router.AddMiddleware and inbox.Handler; keep one", ErrMiswired, outer.consumer)
	}
	if e.config.Consumer == "" || e.config.ShareConsumer {
		return nil
	}
	name := message.HandlerNameFromCtx(msg.Context())
	if name == "" {
		return nil
	}
	first := e.fixedHandler.Load()
	if first == nil {
		claimed := name // only this copy escapes: no allocation per message
		e.fixedHandler.CompareAndSwap(nil, &claimed)
		first = e.fixedHandler.Load()
	}
	if *first != name {
		return fmt.Errorf("%w: handlers %q and %q both reach the fixed consumer %q (inbox.Config.Consumer), so they would share one claim per event and each event would run in only one of them; leave Consumer empty to key each handler by its name, give each handler a middleware of its own, or set ShareConsumer if one of them is enough", ErrMiswired, *first, name, consumer)
	}
	return nil
}

// checkHandlerCall looks, after the handler chain returned success, for
// middlewares inside the inbox that repeated or swallowed a handler call;
// stop means the transaction must not commit, and err is the message's
// result.
func (e *engine) checkHandlerCall(s *session, msg *message.Message, poisonedBefore string) (stop bool, err error) {
	if n := s.calls.Load(); n > 1 {
		return true, errCalledTwice(s, n)
	}
	// PoisonQueue inside the inbox turned the handler's error into a
	// success: committing would keep the failed attempt's writes and the
	// claim, and the event could never be replayed from the poison queue.
	// Rolling back instead is what PoisonQueue outside the inbox does.
	if reason := msg.Metadata.Get(poisonReasonKey); reason != "" && reason != poisonedBefore {
		e.config.Logger.Error("Inbox: a PoisonQueue middleware inside the inbox took this message; its transaction is rolled back instead of committed, and the message is acked. Put PoisonQueue outside the inbox: wrap the handler with inbox.Handler, or add the inbox last", ErrMiswired, watermill.LogFields{
			"consumer": s.consumer, "event_id": s.eventID, "message_uuid": msg.UUID, "reason_poisoned": reason,
		})
		return true, nil
	}
	return false, nil
}

type txUse int

const (
	txUsed txUse = iota + 1
	txUnusedReported
)

// reportUnusedTx logs, once per consumer, a handler that succeeded without
// taking the transaction: whatever it wrote went around the claim. A
// consumer that took the transaction for an earlier message is not
// reported, so that a handler which skips events it does not care about is
// not taken for a miswired one.
func (e *engine) reportUnusedTx(s *session, msg *message.Message) {
	if s.txNotNeeded.Load() {
		return
	}
	// A map under a read lock rather than a sync.Map, whose any keys would
	// cost an allocation per message.
	taken := s.txTaken.Load()
	e.txUseMu.RLock()
	use := e.txUse[s.consumer]
	e.txUseMu.RUnlock()
	if use == txUsed || (use == txUnusedReported && !taken) {
		return
	}
	e.txUseMu.Lock()
	defer e.txUseMu.Unlock()
	if e.txUse == nil {
		e.txUse = map[string]txUse{}
	}
	if taken {
		e.txUse[s.consumer] = txUsed
		return
	}
	if e.txUse[s.consumer] != 0 {
		return
	}
	e.txUse[s.consumer] = txUnusedReported
	e.config.Logger.Error("Inbox: the handler succeeded without taking the inbox transaction, so none of its SQL writes commit with the claim: after a crash its redelivery is acked as a duplicate and a write made elsewhere is lost or doubled. Write through inbox.TxFromContext(msg.Context()) (pgxinbox.TxFromContext on a native pgx store), not through the *sql.DB or another transaction; if the handler deliberately writes nothing in SQL, call inbox.TxNotNeeded(msg.Context()) in it. Logged once per consumer", ErrMiswired, watermill.LogFields{
		"consumer": s.consumer, "event_id": s.eventID, "message_uuid": msg.UUID,
	})
}

// reportWrongAccessor logs, once per consumer, a handler that asked
// accessor for the transaction of a store that hands out another kind: it
// got none, so it fails, panics on nil, or writes around the claim.
func (e *engine) reportWrongAccessor(s *session, accessor string) {
	e.wrongAccessorMu.Lock()
	defer e.wrongAccessorMu.Unlock()
	if e.wrongAccessor[s.consumer] {
		return
	}
	if e.wrongAccessor == nil {
		e.wrongAccessor = map[string]bool{}
	}
	e.wrongAccessor[s.consumer] = true
	right := "inbox.TxFromContext(msg.Context()), which returns its *sql.Tx"
	if _, ok := s.tx.(SQLTx); !ok {
		right = storeAccessor(e.config.Store) + "(msg.Context())"
	}
	e.config.Logger.Error(fmt.Sprintf("Inbox: %s returned no transaction: the store (%T) hands out another kind; take it with %s. The handler got ok == false and none of its writes can commit with the claim. Logged once per consumer", accessor, e.config.Store, right), ErrMiswired, watermill.LogFields{
		"consumer": s.consumer, "event_id": s.eventID, "message_uuid": s.msg.UUID,
	})
}

// storeAccessor names the transaction accessor of store's package, by the
// convention of this module's stores: [pgxinbox.TxFromContext] for a
// [*pgxinbox.Store].
//
// [pgxinbox.TxFromContext]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#TxFromContext
// [*pgxinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#Store
func storeAccessor(store Store) string {
	t := reflect.TypeOf(store)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return path.Base(t.PkgPath()) + ".TxFromContext"
}
