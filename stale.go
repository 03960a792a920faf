package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/errtext"
	"github.com/watermill-inbox/inbox/observe"
)

// EventTimeFunc returns when the producer created the event, and false when
// the message does not say. Messages without a time are never stale.
type EventTimeFunc func(msg *message.Message) (time.Time, bool)

// EventTimeFromMetadata reads the event time from a metadata value in RFC
// 3339 form ("2006-01-02T15:04:05.999999999Z07:00"), as the producer wrote
// it. A missing or unparsable value means no time: the message is not
// checked.
func EventTimeFromMetadata(key string) EventTimeFunc {
	return func(msg *message.Message) (time.Time, bool) {
		v := msg.Metadata.Get(key)
		if v == "" {
			return time.Time{}, false
		}
		at, err := time.Parse(time.RFC3339Nano, v)
		return at, err == nil
	}
}

// EventTimeFromContext reads the event time from the message context with
// fn, for subscribers that put it there. With watermill-kafka (v3 and
// later), whose subscriber stores each record's timestamp in the context:
//
//	EventTime: inbox.EventTimeFromContext(kafka.MessageTimestampFromCtx)
//
// A Kafka record timestamp is when that record was produced: it ages a
// replay from an old offset, but not an old event that a relay published
// again, which gets a new record. A time the producer put in the event
// covers both.
func EventTimeFromContext(fn func(ctx context.Context) (time.Time, bool)) EventTimeFunc {
	return func(msg *message.Message) (time.Time, bool) { return fn(msg.Context()) }
}

// StalePolicy is what the middleware does with an event older than
// [Config.MaxEventAge]. Such an event's inbox row may already have been
// purged, so a duplicate of it can no longer be recognised.
type StalePolicy int

const (
	// StaleProcess logs a warning (at info level, Watermill loggers have no
	// warning level) and processes the event as usual: a duplicate whose row
	// was purged runs the handler again.
	StaleProcess StalePolicy = iota
	// StaleReject nacks the message with an error wrapping [ErrStaleEvent],
	// before any SQL, for a poison queue to take. Without one the message is
	// redelivered forever.
	StaleReject
	// StaleSkip acks the message without calling the handler and logs it
	// at error level: its effect is lost if it was never processed.
	StaleSkip
)

// stale applies the stale-event policy; stop means the message goes no
// further, with err as its result.
func (e *engine) stale(msg *message.Message, consumer, eventID string, ob *observe.Observation) (stop bool, err error) {
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
		ob.Outcome = observe.Stale
		return true, fmt.Errorf("%w: event %s for consumer %q is %s old, MaxEventAge is %s", ErrStaleEvent, errtext.Quote(eventID), consumer, age.Round(time.Second), e.config.MaxEventAge)
	case StaleSkip:
		ob.Outcome = observe.Stale
		e.config.Logger.Error("Inbox: stale event skipped, the handler was not called; if it was never processed, its effect is missing", ErrStaleEvent, fields)
		return true, nil
	}
	e.config.Logger.Info("Inbox: warning: stale event processed; its row may have been purged, so it may be an undetected duplicate", fields)
	return false, nil
}
