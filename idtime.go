package inbox

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// TimeInEventID returns the creation time an event id carries, and false
// for an id that carries none. Two kinds of id carry one, to the
// millisecond, the same in every copy of the event:
//
//   - a UUIDv7 (RFC 9562) in its 36-character hyphenated form, either case,
//     as [github.com/google/uuid.NewV7] makes;
//   - a ULID, 26 characters of Crockford's base32, either case, as
//     Watermill's [watermill.NewULID] makes.
//
// The time is the producer's clock when it made the id.
func TimeInEventID(id string) (time.Time, bool) {
	at, err := inboxdriver.EventIDTime(id)
	return at, err == nil
}

// EventTimeFromEventID reads the event time from the event id eventID
// returns, by [TimeInEventID], for [Config.MaxEventAge]: an id without a time
// means no time, and the message is not checked. With ids that carry their
// time, nothing else needs to travel with the event.
func EventTimeFromEventID(eventID EventIDFunc) EventTimeFunc {
	return func(msg *message.Message) (time.Time, bool) {
		id, err := eventID(msg)
		if err != nil {
			return time.Time{}, false
		}
		return TimeInEventID(id)
	}
}
