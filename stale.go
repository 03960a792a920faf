package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/clock"
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

// staleGuard applies [Config.StaleEvents] to events older than
// [Config.MaxEventAge], before any SQL.
type staleGuard struct {
	guardDefaults
	maxAge    time.Duration
	eventTime EventTimeFunc
	policy    StalePolicy
	logger    watermill.LoggerAdapter
}

func newStaleGuard(d guardDeps) guard {
	if d.config.MaxEventAge <= 0 {
		return guardDefaults{}
	}
	return &staleGuard{maxAge: d.config.MaxEventAge, eventTime: d.config.EventTime, policy: d.config.StaleEvents, logger: d.config.Logger}
}

// beforeClaim applies the policy to a stale event.
func (g *staleGuard) beforeClaim(v *visit) error {
	msg, consumer, eventID, ob := v.msg, v.consumer, v.eventID, v.ob
	at, ok := g.eventTime(msg)
	if !ok || at.IsZero() {
		return nil
	}
	age := clock.Now().Sub(at)
	if age <= g.maxAge {
		return nil
	}
	ob.Stale = true
	fields := watermill.LogFields{
		"consumer": consumer, "event_id": eventID, "message_uuid": msg.UUID,
		"event_time": at, "age": age.String(), "max_event_age": g.maxAge.String(),
	}
	switch g.policy {
	case StaleReject:
		ob.Outcome = observe.Stale
		return fmt.Errorf("%w: event %s for consumer %q is %s old, MaxEventAge is %s", ErrStaleEvent, errtext.Quote(eventID), consumer, age.Round(time.Second), g.maxAge)
	case StaleSkip:
		ob.Outcome = observe.Stale
		g.logger.Error("Inbox: stale event skipped, the handler was not called; if it was never processed, its effect is missing", ErrStaleEvent, fields)
		return errAck
	}
	g.logger.Info("Inbox: warning: stale event processed; its row may have been purged, so it may be an undetected duplicate", fields)
	return nil
}
