package inbox

import (
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// traced runs the message through [engine.observe] and logs, the first time
// of each kind per consumer, a message refused with a permanent error or a
// handler that failed or panicked: the middlewares in front (a PoisonQueue
// that acks what it poisons, a Retry without a logger) may log nothing, and
// the router logs only what reaches it.
func (e *engine) traced(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	finished := false
	defer func() {
		if !finished {
			e.trace(msg, "handler_panicked", errPanicked, "Inbox: the handler panicked and rolled back; the middlewares in front recover, retry or poison it")
		}
	}()
	produced, err := e.observe(h, msg)
	finished = true
	if err == nil || IsTransient(err) {
		return produced, err
	}
	if kind, ok := permanentKind(err); ok {
		e.trace(msg, kind, err, "Inbox: message refused, the handler was not called; the middlewares in front nack, poison or drop it")
	} else {
		e.trace(msg, "handler_failed", err, "Inbox: the handler failed and rolled back; the middlewares in front retry or poison it")
	}
	return produced, err
}

// trace logs line with err once per kind and consumer.
func (e *engine) trace(msg *message.Message, kind string, err error, line string) {
	consumer, _ := e.consumer(msg.Context())
	if !e.report.first("trace/"+kind, consumer) {
		return
	}
	e.config.Logger.Error(line+"; logged once per kind and consumer", err, watermill.LogFields{
		"consumer": consumer, "kind": kind, "message_uuid": msg.UUID,
	})
}
