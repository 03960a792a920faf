package inbox

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/observe"
)

// onceSet remembers which (kind, consumer) pairs have happened in one
// middleware, so that each is logged once: a suspicion repeated on every
// message would bury the logs it is meant to be seen in.
type onceSet struct {
	mu   sync.Mutex
	seen map[onceKey]struct{}
}

type onceKey struct{ kind, consumer string }

// first reports whether (kind, consumer) happens for the first time.
func (o *onceSet) first(kind, consumer string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := onceKey{kind, consumer}
	if _, ok := o.seen[k]; ok {
		return false
	}
	if o.seen == nil {
		o.seen = map[onceKey]struct{}{}
	}
	o.seen[k] = struct{}{}
	return true
}

// warn reports a suspicion about consumer's wiring: on the message's
// observation (when ob is not nil), and the first time of each kind per
// consumer in the log and in the consumer's lease, for the inbox check
// command. It never stops the message: a guard refuses only on proof
// (docs/wiring.md#run-time-checks).
func (e *engine) warn(kind observe.Warning, consumer string, ob *observe.Observation, err error, msg string, fields watermill.LogFields) {
	if ob != nil {
		ob.Warning = kind
	}
	if !e.once.first(string(kind), consumer) {
		return
	}
	if fields == nil {
		fields = watermill.LogFields{}
	}
	fields["consumer"] = consumer
	fields["warning"] = string(kind)
	e.config.Logger.Error("Inbox: "+msg+"; logged once per consumer", err, fields)
	e.lease.noteWarning(e, consumer, kind)
}

// unchecked reports, once per check and consumer, a guard that could not
// run: its own failure never stops a message, the consumer only goes
// unchecked for it.
func (e *engine) unchecked(check, consumer string, err error) {
	if !e.once.first("unchecked/"+check, consumer) {
		return
	}
	e.config.Logger.Error("Inbox: the "+check+" check could not run, so this consumer goes unchecked for it; logged once per consumer", err, watermill.LogFields{
		"consumer": consumer, "warning": string(observe.Unchecked), "check": check,
	})
	e.lease.noteWarning(e, consumer, observe.Unchecked)
}
