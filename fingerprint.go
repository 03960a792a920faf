package inbox

import (
	"crypto/sha256"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/errtext"
	"github.com/watermill-inbox/inbox/observe"
)

// MaxFingerprintLength is the longest fingerprint accepted, in bytes (a
// SHA-512 digest). A longer one fails the message before any SQL.
const MaxFingerprintLength = 64

// FingerprintFunc returns a digest of what makes an event that event,
// usually its payload. Two deliveries of one event must get the same
// fingerprint, so leave out what a relay or broker may change (delivery
// metadata, timestamps). Returning nil records no fingerprint for that
// message, which then never counts as a reused id.
type FingerprintFunc func(msg *message.Message) []byte

// PayloadFingerprint is the SHA-256 digest of the payload. Watermill's
// marshalers and the SQL outbox forward payloads byte for byte, so every
// delivery of an event gets the same fingerprint.
func PayloadFingerprint(msg *message.Message) []byte {
	sum := sha256.Sum256(msg.Payload)
	return sum[:]
}

// PayloadAndMetadataFingerprint is the SHA-256 digest of the payload and of
// the given metadata values, for events whose identity also lives in
// metadata (a type or schema version). Only the listed keys count, so
// metadata a broker adds on the way does not make a redelivery look like
// another event.
func PayloadAndMetadataFingerprint(keys ...string) FingerprintFunc {
	keys = append([]string(nil), keys...)
	return func(msg *message.Message) []byte {
		h := sha256.New()
		for _, k := range keys {
			v := msg.Metadata.Get(k)
			// Length prefixes keep ("ab", "c") apart from ("a", "bc").
			_, _ = fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(v), v)
		}
		_, _ = h.Write(msg.Payload)
		return h.Sum(nil)
	}
}

// IDReusePolicy is what the middleware does with a duplicate whose
// fingerprint differs from the one stored with the original: the producer
// gave one event id to two different events, and the second would otherwise
// be acked silently as a duplicate. Every policy reports [OutcomeIDReused] to
// the observer and never calls the handler.
type IDReusePolicy int

const (
	// IDReuseLog logs the reuse at error level and acks the message as a
	// duplicate: delivery goes on as without fingerprints.
	IDReuseLog IDReusePolicy = iota
	// IDReuseReject nacks the message with an error wrapping
	// [ErrEventIDReused], for a poison queue to take. Without one the
	// message is redelivered forever.
	IDReuseReject
	// IDReuseIgnore acks the message as a duplicate without logging; only
	// the observer (a metric) sees it.
	IDReuseIgnore
)

// idReused applies the id-reuse policy to a duplicate whose fingerprint
// differs from the original's, and returns the message's result.
func idReused(policy IDReusePolicy, logger watermill.LoggerAdapter, msg *message.Message, consumer, eventID string, ob *observe.Observation) error {
	ob.Outcome = observe.IDReused
	err := fmt.Errorf("%w: event %s for consumer %q was processed with another fingerprint (message %s)", ErrEventIDReused, errtext.Quote(eventID), consumer, msg.UUID)
	switch policy {
	case IDReuseReject:
		return err
	case IDReuseLog:
		logger.Error("Inbox: event id reused with another payload; acked as a duplicate without calling the handler", err, watermill.LogFields{
			"consumer": consumer, "event_id": eventID, "message_uuid": msg.UUID,
		})
	}
	return nil
}
