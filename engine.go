package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/errtext"
)

// engine is one configured middleware: everything the guarantee rests on
// (consumer and event id checks, the duplicate path, rollback on error or
// panic, after-commit hooks, the context handed to the handler and restored
// afterwards) for every [Store], whatever its transactions are.
//
// This file holds the message's path; the engine's other methods are in one
// file per facet, each named for it: the wiring checks (wiring.go), the
// consumer's owning service (service.go), the claim pool (pool.go), the
// observers (observe.go) and the produced publisher (producedtx.go). The
// path calls down into them and into the session (session.go); the session
// calls back into none of them.
type engine struct {
	config  Config
	checkID func(id string) (string, error) // the store's [EventIDChecker], or nil

	fixedHandler atomic.Pointer[string] // first handler name seen with a fixed Consumer
	txUseMu      sync.RWMutex
	txUse        map[string]txUse // per consumer, for reportUnusedTx (wiring.go)

	observers []Observer // [Config.Observer], [Observers] flattened (observe.go)
	panics    observerPanics

	publisherMu sync.RWMutex
	publishers  map[string]publisherCheck // per consumer (producedtx.go)

	wrongAccessorMu sync.Mutex
	wrongAccessor   map[string]bool // consumers reported by reportWrongAccessor

	pool           ClaimPool // the store's, nil when its pool is not known
	poolWaitMu     sync.Mutex
	poolWaitLogged map[string]bool // consumers reported by poolWaitErr (pool.go)

	registry ConsumerRegistry // the store's, nil when unchecked
	ownersMu sync.RWMutex
	owners   map[string]ownership // per consumer, for checkOwner (service.go)
}

// middleware wraps h.
func (e *engine) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return e.handle(h, msg)
	}
}

func (e *engine) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	if len(e.observers) == 0 {
		return e.process(h, msg, nil)
	}
	ob := Observation{Start: time.Now()}
	orig := msg.Context()
	ctx := orig
	var buf [4]func(Observation)
	dones := buf[:0]
	for _, o := range e.observers {
		var done func(Observation)
		ctx, done = e.startObserver(o, ctx, orig)
		dones = append(dones, done)
	}
	msg.SetContext(ctx)
	defer msg.SetContext(orig)
	finished := false
	defer func() {
		if !finished { // the handler panicked
			ob.Outcome, ob.Err = OutcomeRolledBack, errPanicked
			ob.Duration = time.Since(ob.Start)
			e.observed(dones, ob)
		}
	}()
	produced, err := e.process(h, msg, &ob)
	finished = true
	ob.Err = err
	ob.Duration = time.Since(ob.Start)
	e.observed(dones, ob)
	return produced, err
}

// process is the inbox: claim, handler, commit. ob, when not nil, records
// what happened.
func (e *engine) process(h message.HandlerFunc, msg *message.Message, ob *Observation) ([]*message.Message, error) {
	var scratch Observation
	if ob == nil {
		ob = &scratch
	}
	ctx := msg.Context()
	consumer, err := e.consumer(ctx)
	if err != nil {
		ob.Outcome = OutcomeMissingID
		return nil, err
	}
	ob.Consumer = consumer
	if err := e.checkWiring(msg, consumer); err != nil {
		ob.Outcome = OutcomeMiswired
		return nil, err
	}
	if err := e.checkOwner(ctx, consumer); err != nil {
		ob.Outcome = OutcomeClaimFailed
		if errors.Is(err, ErrMiswired) {
			ob.Outcome = OutcomeMiswired
		}
		return nil, err
	}
	eventID, err := e.eventID(msg)
	if err != nil {
		ob.Outcome = OutcomeMissingID
		if errors.Is(err, ErrInvalidEventID) {
			ob.Outcome = OutcomeInvalidID
		}
		return nil, err
	}
	ob.EventID = eventID
	if e.config.MaxEventAge > 0 {
		if stop, err := e.stale(msg, consumer, eventID, ob); stop {
			return nil, err
		}
	}
	var fingerprint []byte
	if e.config.Fingerprint != nil {
		fingerprint = e.config.Fingerprint(msg)
		if len(fingerprint) > MaxFingerprintLength {
			ob.Outcome = OutcomeClaimFailed
			return nil, fmt.Errorf("inbox: the fingerprint of event %s is %d bytes, at most %d allowed (inbox.Config.Fingerprint)", errtext.Quote(eventID), len(fingerprint), MaxFingerprintLength)
		}
	}

	// A watermill-sql subscriber's transaction: the claim's stands in for
	// it (subscribertx.go).
	subscriber := lookupSubscriberTx(ctx)

	if e.config.Observer != nil {
		ob.ClaimStart = time.Now()
	}
	use, err := e.enterPool(ctx)
	if err != nil {
		ob.Outcome = OutcomeClaimFailed
		return nil, err
	}
	tx, stored, err := e.config.Store.Claim(ctx, e.config.TxOptions, consumer, eventID, fingerprint)
	if e.config.Observer != nil {
		ob.ClaimDuration = time.Since(ob.ClaimStart)
	}
	if tx == nil { // its connection is back in the pool
		use.leave()
	}
	if err != nil {
		ob.Outcome = OutcomeClaimFailed
		if errors.Is(err, ErrInFlight) {
			ob.Outcome = OutcomeInFlight
		}
		return nil, fmt.Errorf("inbox: claiming event %s for consumer %q: %w", errtext.Quote(eventID), consumer, err)
	}
	if tx == nil {
		// A NULL stored fingerprint (claimed before fingerprints were on,
		// or by a message the function returned nil for) never mismatches.
		if stored != nil && fingerprint != nil && !bytes.Equal(stored, fingerprint) {
			return nil, e.idReused(msg, consumer, eventID, ob)
		}
		ob.Outcome = OutcomeDuplicate
		e.config.Logger.Debug("Inbox: duplicate skipped", watermill.LogFields{
			"consumer": consumer, "event_id": eventID, "message_uuid": msg.UUID,
		})
		return nil, nil
	}

	committed := false
	defer func() {
		// Also runs while a handler panic unwinds: the claim disappears
		// with the handler's writes and the panic goes on to Recoverer.
		// Without cancellation, so that a cancelled message still ends its
		// transaction instead of leaving the connection to be discarded.
		if !committed {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
		use.leave()
	}()
	s := &session{e: e, tx: tx, consumer: consumer, eventID: eventID, msg: msg}
	defer s.end()
	hctx := context.WithValue(ctx, sessionKey{}, s)
	if subscriber.found {
		if hctx, err = subscriber.standIn(hctx, native(tx)); err != nil {
			ob.Outcome = OutcomeMiswired
			return nil, err
		}
		// The handler may take it through the subscriber's accessor,
		// which the middleware cannot see (reportUnusedTx).
		s.markTxTaken()
	}
	hctx, stopWatch := e.watchPool(hctx, use)
	defer stopWatch()
	msg.SetContext(hctx)
	defer msg.SetContext(ctx)

	ob.Outcome = OutcomeRolledBack
	poisoned := msg.Metadata.Get(poisonReasonKey)
	produced, err := h(msg)
	if err != nil {
		if errors.Is(context.Cause(hctx), errPoolWait) {
			ob.Outcome = OutcomeMiswired
			return nil, e.poolWaitErr(s, err)
		}
		return nil, err
	}
	if stop, err := e.checkHandlerCall(s, msg, poisoned); stop {
		ob.Outcome = OutcomeMiswired
		return nil, err
	}
	if e.config.ProducedPublisher != nil && len(produced) > 0 {
		s.markTxTaken()
		if err := e.publishInTx(hctx, s, produced); err != nil {
			if errors.Is(err, ErrMiswired) {
				ob.Outcome = OutcomeMiswired
			}
			return nil, err
		}
		produced = nil
	}
	if err := tx.Commit(ctx); err != nil {
		ob.Outcome = OutcomeCommitFailed
		return nil, fmt.Errorf("inbox: committing event %s for consumer %q (the redelivery will tell whether it was committed): %w", errtext.Quote(eventID), consumer, err)
	}
	committed = true
	use.leave()
	ob.Outcome = OutcomeProcessed
	e.reportUnusedTx(s, msg)
	ob.AfterCommitErr = e.runHooks(ctx, s)
	return produced, nil
}

// stale applies the stale-event policy; stop means the message goes no
// further, with err as its result.
func (e *engine) stale(msg *message.Message, consumer, eventID string, ob *Observation) (stop bool, err error) {
	at, ok := e.config.EventTime(msg)
	if !ok || at.IsZero() {
		return false, nil
	}
	age := time.Since(at)
	if age <= e.config.MaxEventAge {
		return false, nil
	}
	ob.Stale = true
	fields := watermill.LogFields{
		"consumer": consumer, "event_id": eventID, "message_uuid": msg.UUID,
		"event_time": at, "age": age.String(), "max_event_age": e.config.MaxEventAge.String(),
	}
	switch e.config.StaleEvents {
	case StaleReject:
		ob.Outcome = OutcomeStale
		return true, fmt.Errorf("%w: event %s for consumer %q is %s old, MaxEventAge is %s", ErrStaleEvent, errtext.Quote(eventID), consumer, age.Round(time.Second), e.config.MaxEventAge)
	case StaleSkip:
		ob.Outcome = OutcomeStale
		e.config.Logger.Error("Inbox: STALE EVENT SKIPPED, the handler was not called; if it was never processed before, its effect is missing", ErrStaleEvent, fields)
		return true, nil
	}
	e.config.Logger.Info("Inbox: warning: stale event processed; its inbox row may have been purged, so it may be a duplicate the inbox can no longer detect", fields)
	return false, nil
}

// idReused applies the id-reuse policy to a duplicate whose fingerprint
// differs from the original's, and returns the message's result.
func (e *engine) idReused(msg *message.Message, consumer, eventID string, ob *Observation) error {
	ob.Outcome = OutcomeIDReused
	err := fmt.Errorf("%w: event %s for consumer %q was already processed with another fingerprint, so the producer gave one id to two different events (message %s)", ErrEventIDReused, errtext.Quote(eventID), consumer, msg.UUID)
	switch e.config.OnIDReuse {
	case IDReuseReject:
		return err
	case IDReuseLog:
		e.config.Logger.Error("Inbox: event id reused with a different payload; acked as a duplicate, the handler was not called", err, watermill.LogFields{
			"consumer": consumer, "event_id": eventID, "message_uuid": msg.UUID,
		})
	}
	return nil
}

func (e *engine) consumer(ctx context.Context) (string, error) {
	if e.config.Consumer != "" {
		return e.config.Consumer, nil
	}
	name := message.HandlerNameFromCtx(ctx)
	if name == "" {
		return "", ErrNoConsumer
	}
	if err := validateConsumer(name); err != nil {
		return "", fmt.Errorf("inbox: handler name cannot be the consumer (set inbox.Config.Consumer): %w", err)
	}
	return name, nil
}

func (e *engine) eventID(msg *message.Message) (string, error) {
	id, err := e.config.EventID(msg)
	if err != nil {
		if !errors.Is(err, ErrMissingEventID) && !errors.Is(err, ErrInvalidEventID) {
			err = fmt.Errorf("%w: %w", ErrMissingEventID, err)
		}
		return "", err
	}
	if err := ValidateEventID(id); err != nil {
		return "", err
	}
	if e.checkID != nil {
		return e.checkID(id)
	}
	return id, nil
}

// runHooks runs the session's after-commit hooks in order and returns
// their failures. A hook that fails or panics loses only its own effect:
// the transaction has committed, so the message is still processed and
// acked, and the hooks after it still run.
func (e *engine) runHooks(ctx context.Context, s *session) error {
	hooks := s.end()
	if len(hooks) == 0 {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for _, fn := range hooks {
		stack, err := runHook(ctx, fn)
		if err == nil {
			continue
		}
		fields := watermill.LogFields{"consumer": s.consumer, "event_id": s.eventID}
		if stack != nil {
			fields["stack"] = string(stack)
		}
		e.config.Logger.Error("Inbox: after-commit hook failed; its effect is lost for this event", err, fields)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// runHook calls fn, turning a panic into an error, with the panic's stack.
func runHook(ctx context.Context, fn func(context.Context) error) (stack []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			stack, err = debug.Stack(), fmt.Errorf("inbox: after-commit hook panicked: %v", r)
		}
	}()
	return nil, fn(ctx)
}
