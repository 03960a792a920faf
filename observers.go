package inbox

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/observe"
)

// observerPanics counts the panics of a middleware's observers and
// remembers the consumers already told about one.
type observerPanics struct {
	n      atomic.Int64
	mu     sync.Mutex
	logged map[string]bool
}

// flatten lists the observers behind o, those joined by [observe.Join]
// one by one, so that each runs under its own recover: one that panics
// keeps none of the others from seeing the message.
func flatten(o observe.Observer) []observe.Observer {
	switch o := o.(type) {
	case nil:
		return nil
	case observe.Joined:
		var out []observe.Observer
		for _, inner := range o {
			out = append(out, flatten(inner)...)
		}
		return out
	}
	return []observe.Observer{o}
}

// startObserver calls [observe.Observer.Start] on o. A panic leaves ctx as
// it was and o
// without a done callback for this message; the message goes on.
func (e *engine) startObserver(o observe.Observer, ctx, orig context.Context) (next context.Context, done func(observe.Observation)) {
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
// [observe.Joined] does, each under recover: the message's result is decided
// and must reach the router whatever an observer does, produced messages
// included.
func (e *engine) observed(dones []func(observe.Observation), ob observe.Observation) {
	for i := len(dones) - 1; i >= 0; i-- {
		if dones[i] == nil {
			continue
		}
		ob.ObserverPanics = e.panics.n.Load()
		e.callDone(i, dones[i], ob)
	}
}

func (e *engine) callDone(i int, done func(observe.Observation), ob observe.Observation) {
	defer func() {
		if r := recover(); r != nil {
			e.observerPanicked(e.observers[i], "done", r, ob.Consumer, ob.EventID)
		}
	}()
	done(ob)
}

// observerPanicked counts a recovered observer panic and logs the first of
// each consumer at error level, with its stack.
func (e *engine) observerPanicked(o observe.Observer, callback string, r any, consumer, eventID string) {
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
	e.config.Logger.Error("Inbox: an observer panicked; recovered, the outcome is unchanged but its metrics or traces miss it; logged once per consumer", err, watermill.LogFields{
		"consumer": consumer, "event_id": eventID, "callback": callback, "stack": string(debug.Stack()),
	})
}

// observe runs the message through [engine.process] between its observers'
// Start and done callbacks; without observers it costs nothing.
func (e *engine) observe(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	var ob observe.Observation
	if len(e.observers) == 0 {
		return e.process(h, msg, &ob)
	}
	ob.Start = time.Now()
	orig := msg.Context()
	ctx := orig
	var buf [4]func(observe.Observation)
	dones := buf[:0]
	for _, o := range e.observers {
		var done func(observe.Observation)
		ctx, done = e.startObserver(o, ctx, orig)
		dones = append(dones, done)
	}
	msg.SetContext(ctx)
	defer msg.SetContext(orig)
	finished := false
	defer func() {
		if !finished { // the handler panicked
			ob.Outcome, ob.Err = observe.RolledBack, errPanicked
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
