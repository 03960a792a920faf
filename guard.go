package inbox

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/session"
	"github.com/watermill-inbox/inbox/observe"
)

// guard is one check or policy of the middleware, plugged into the
// engine's message path at three named points. The engine runs every guard
// at each point, in the order of [guards], and knows none of them by name;
// a guard is a type in a file of its own, with its own state, and is added
// by one line in [guards]. Embedding [guardDefaults] lets a guard implement
// only the points it looks at.
//
// A guard refuses a message only on proof that processing it would lose or
// double an effect; on suspicion it warns through the [reporter] it was
// built with, and the message goes on. What a guard does in the database
// it does in the message's time and context, so that it ends with the
// router (which waits for the messages in flight); the one exception, the
// lease's renewal, runs beside a message so that a blocked lease table
// never slows one, and ends within its own short timeout.
type guard interface {
	// beforeClaim looks at a message before any SQL of the inbox's own;
	// an error ends the message with it ([errAck]: acked, the handler not
	// called).
	beforeClaim(v *visit) error
	// afterHandler looks at a handler call that succeeded, before the
	// commit; an error rolls the transaction back and ends the message
	// with it ([errAck]: acked).
	afterHandler(v *visit) error
	// afterCommit looks at a committed message.
	afterCommit(v *visit)
}

// guardDefaults are the points a guard does not look at.
type guardDefaults struct{}

func (guardDefaults) beforeClaim(*visit) error  { return nil }
func (guardDefaults) afterHandler(*visit) error { return nil }
func (guardDefaults) afterCommit(*visit)        {}

// guardDeps is what a guard may be built from: the configuration, the
// store, and the reporter for its warnings.
type guardDeps struct {
	config Config
	store  inboxdriver.Store
	report *reporter
}

// guards builds the middleware's guards, in the order they run at each
// point. The lease is last: it carries the warnings the others gave.
func guards(d guardDeps) []guard {
	return []guard{
		newWiringGuard(d),
		newStaleGuard(d),
		newPublisherGuard(d),
		newTxUseGuard(d),
		newLeaseGuard(d),
	}
}

// visit is one message on its way through the engine, as the guards see it.
type visit struct {
	msg      *message.Message
	handler  message.HandlerFunc // what the middleware wraps
	consumer string
	eventID  string
	ob       *observe.Observation

	// From the claim on:
	s *session.Session
	// poisoned is the message's PoisonQueue reason before the handler.
	poisoned string
	// produced is what the handler returned; a guard after the handler
	// may take it over (publishing it in the transaction).
	produced []*message.Message
}

// errAck ends a message without its handler, acked.
var errAck = errors.New("inbox: acked without the handler")
