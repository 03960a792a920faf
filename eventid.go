package inbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/errtext"
)

// DefaultEventIDMetadataKey is the metadata key [DefaultEventID] reads first.
const DefaultEventIDMetadataKey = "event_id"

// MaxEventIDLength is the longest event id accepted, in bytes: the width of
// the inbox table's event_id column on every dialect.
const MaxEventIDLength = inboxdriver.MaxEventIDLength

// EventIDFunc returns the stable id the producer gave an event. It must return
// the same id for every delivery of the same event and never derive it from
// the delivery (a timestamp, a partition offset). Return an error wrapping
// [ErrMissingEventID] when the message has no id.
type EventIDFunc func(msg *message.Message) (string, error)

// DefaultEventID reads the "event_id" metadata value and falls back to
// msg.UUID. Watermill keeps msg.UUID across the Kafka marshaler and the SQL
// outbox forwarder, so the UUID is stable for messages a producer published
// once; the metadata value wins because a producer that republishes an event
// (a relay retry building a new envelope) keeps it while the UUID may change.
func DefaultEventID(msg *message.Message) (string, error) {
	if id := msg.Metadata.Get(DefaultEventIDMetadataKey); id != "" {
		return id, nil
	}
	if msg.UUID != "" {
		return msg.UUID, nil
	}
	return "", fmt.Errorf("%w: neither %q metadata nor message UUID is set", ErrMissingEventID, DefaultEventIDMetadataKey)
}

// EventIDFromMetadata reads the event id from one metadata key only.
func EventIDFromMetadata(key string) EventIDFunc {
	return func(msg *message.Message) (string, error) {
		id, ok := msg.Metadata[key]
		if !ok {
			return "", fmt.Errorf("%w: metadata %q is not set", ErrMissingEventID, key)
		}
		return id, nil
	}
}

// EventIDFromUUID uses msg.UUID, ignoring metadata.
func EventIDFromUUID(msg *message.Message) (string, error) {
	if msg.UUID == "" {
		return "", fmt.Errorf("%w: message UUID is empty", ErrMissingEventID)
	}
	return msg.UUID, nil
}

// EventIDFromJSONField reads a top-level field of a JSON object payload, for
// producers that put the event id inside the event ({"event_id": "...", ...}).
// The field must be a string or an integer. A payload that is not a JSON
// object is reported as [ErrMissingEventID], since no id can be found in it.
func EventIDFromJSONField(field string) EventIDFunc {
	return func(msg *message.Message) (string, error) {
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(msg.Payload, &doc); err != nil {
			return "", fmt.Errorf("%w: payload is not a JSON object: %v", ErrMissingEventID, err)
		}
		raw, ok := doc[field]
		if !ok || bytes.Equal(raw, []byte("null")) {
			return "", fmt.Errorf("%w: payload has no %q field", ErrMissingEventID, field)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			return s, nil
		}
		var n json.Number
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&n); err == nil && !strings.ContainsAny(n.String(), ".eE") {
			return n.String(), nil
		}
		return "", fmt.Errorf("%w: payload field %q is %s, want a string or an integer", ErrInvalidEventID, field, errtext.Quote(string(raw)))
	}
}
