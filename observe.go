package inbox

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
)

// observerPanics counts the panics of a middleware's observers and
// remembers the consumers already told about one.
type observerPanics struct {
	n      atomic.Int64
	mu     sync.Mutex
	logged map[string]bool
}

// flatten lists the observers behind o, those combined by [Observers]
// one by one, so that each runs under its own recover: one that panics
// keeps none of the others from seeing the message.
func flatten(o Observer) []Observer {
	switch o := o.(type) {
	case nil:
		return nil
	case observers:
		var out []Observer
		for _, inner := range o {
			out = append(out, flatten(inner)...)
		}
		return out
	}
	return []Observer{o}
}

// startObserver calls [Observer.Start] on o. A panic leaves ctx as it was and o
// without a done callback for this message; the message goes on.
func (e *engine) startObserver(o Observer, ctx, orig context.Context) (next context.Context, done func(Observation)) {
	defer func() {
		if r := recover(); r != nil {
			consumer, _ := e.consumer(orig)
			e.observerPanicked(o, "Start", r, consumer, "")
			next, done = ctx, nil
		}
	}()
	next, done = o.Start(ctx)
	if next == nil { // a broken observer must not break the handler's context
		next = ctx
	}
	return next, done
}

// observed calls the done callbacks, the last started first, as
// [Observers] does, each under recover: the message's result is decided
// and must reach the router whatever an observer does, produced messages
// included.
func (e *engine) observed(dones []func(Observation), ob Observation) {
	for i := len(dones) - 1; i >= 0; i-- {
		if dones[i] == nil {
			continue
		}
		ob.ObserverPanics = e.panics.n.Load()
		e.callDone(i, dones[i], ob)
	}
}

func (e *engine) callDone(i int, done func(Observation), ob Observation) {
	defer func() {
		if r := recover(); r != nil {
			e.observerPanicked(e.observers[i], "done", r, ob.Consumer, ob.EventID)
		}
	}()
	done(ob)
}

// observerPanicked counts a recovered observer panic and logs the first of
// each consumer at error level, with its stack.
func (e *engine) observerPanicked(o Observer, callback string, r any, consumer, eventID string) {
	e.panics.n.Add(1)
	p := &e.panics
	p.mu.Lock()
	first := !p.logged[consumer]
	if first {
		if p.logged == nil {
			p.logged = map[string]bool{}
		}
		p.logged[consumer] = true
	}
	p.mu.Unlock()
	if !first {
		return
	}
	err := fmt.Errorf("inbox: observer %T panicked in %s: %v", o, callback, r)
	e.config.Logger.Error("Inbox: an Observer panicked; the panic was recovered and the message's outcome is unchanged, but the observer missed it, so its metrics or traces are incomplete. Logged once per consumer; Observation.ObserverPanics counts every panic", err, watermill.LogFields{
		"consumer": consumer, "event_id": eventID, "callback": callback, "stack": string(debug.Stack()),
	})
}
