package inbox

import (
	"slices"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/observe"
)

// reporter is how guards tell of suspicions and of checks that could not
// run: on the message's observation (the metric), once per kind and
// consumer in the log, and in the consumer's warnings, which the lease
// carries to the inbox check command. It calls no guard back: the lease
// reads [reporter.warnings] when it renews.
//
// Watermill's [watermill.LoggerAdapter] has no warning level, and its
// error level is what alerts and pipelines treat as a failure; a suspicion
// is not one (docs/wiring.md#run-time-checks). So a warning is logged at
// info level, its message starting "Inbox: warning:", with a "warning"
// field naming its kind, and no error value.
type reporter struct {
	logger watermill.LoggerAdapter

	mu      sync.Mutex
	logged  map[[2]string]bool           // (kind, consumer) pairs logged
	kinds   map[string][]observe.Warning // per consumer, the kinds warned of
	failing map[string]map[string]bool   // per consumer, the checks that could not run
	version map[string]int               // per consumer, bumped on every change of its warnings
}

// first reports whether (kind, consumer) happens for the first time.
func (r *reporter) first(kind, consumer string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := [2]string{kind, consumer}
	if r.logged[k] {
		return false
	}
	if r.logged == nil {
		r.logged = map[[2]string]bool{}
	}
	r.logged[k] = true
	return true
}

// warn reports a suspicion about consumer's wiring: on ob (when not nil),
// and the first time of each kind per consumer in the log and in the
// consumer's warnings. It never stops the message: a guard refuses only on
// proof (docs/wiring.md#run-time-checks).
func (r *reporter) warn(kind observe.Warning, consumer string, ob *observe.Observation, msg string, fields watermill.LogFields) {
	if ob != nil {
		ob.Warning = kind
	}
	if !r.first(string(kind), consumer) {
		return
	}
	if fields == nil {
		fields = watermill.LogFields{}
	}
	fields["consumer"] = consumer
	fields["warning"] = string(kind)
	r.logger.Info("Inbox: warning: "+msg+"; logged once per consumer", fields)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kinds == nil {
		r.kinds = map[string][]observe.Warning{}
	}
	r.kinds[consumer] = append(r.kinds[consumer], kind)
	r.changed(consumer)
}

// unchecked reports that check could not run for consumer, and why: the
// consumer goes unchecked for it until [reporter.checked]. Logged once per
// outage: a check that recovers and fails again is logged again.
func (r *reporter) unchecked(check, consumer string, err error) {
	r.mu.Lock()
	if r.failing == nil {
		r.failing = map[string]map[string]bool{}
	}
	if r.failing[consumer] == nil {
		r.failing[consumer] = map[string]bool{}
	}
	already := r.failing[consumer][check]
	r.failing[consumer][check] = true
	r.changed(consumer)
	r.mu.Unlock()
	if already {
		return
	}
	r.logger.Info("Inbox: warning: the "+check+" check could not run, so this consumer goes unchecked for it until it can", watermill.LogFields{
		"consumer": consumer, "warning": string(observe.Unchecked), "check": check, "reason": err.Error(),
	})
}

// checked reports that check ran for consumer: an earlier
// [reporter.unchecked] is over, and said to be.
func (r *reporter) checked(check, consumer string) {
	r.mu.Lock()
	was := r.failing[consumer][check]
	if was {
		delete(r.failing[consumer], check)
		r.changed(consumer)
	}
	r.mu.Unlock()
	if was {
		r.logger.Info("Inbox: the "+check+" check runs again for this consumer", watermill.LogFields{"consumer": consumer, "check": check})
	}
}

// changed marks consumer's warnings as changed; under r.mu.
func (r *reporter) changed(consumer string) {
	if r.version == nil {
		r.version = map[string]int{}
	}
	r.version[consumer]++
}

// warnings are consumer's warnings as the lease carries them, comma
// separated, and their version, which changes with them.
func (r *reporter) warnings(consumer string) (string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	kinds := make([]string, 0, len(r.kinds[consumer])+1)
	for _, k := range r.kinds[consumer] {
		kinds = append(kinds, string(k))
	}
	if len(r.failing[consumer]) > 0 && !slices.Contains(kinds, string(observe.Unchecked)) {
		kinds = append(kinds, string(observe.Unchecked))
	}
	return strings.Join(kinds, ","), r.version[consumer]
}
