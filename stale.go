package inbox

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
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
