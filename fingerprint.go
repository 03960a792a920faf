package inbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/engine"
)

// MaxFingerprintLength is the longest fingerprint accepted, in bytes (a
// SHA-512 digest). A longer one fails the message before any SQL.
const MaxFingerprintLength = engine.MaxFingerprintLength

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
// be acked silently as a duplicate. Every policy reports OutcomeIDReused to
// the observer and never calls the handler.
type IDReusePolicy int

const (
	// IDReuseLog logs the reuse at error level and acks the message as a
	// duplicate: delivery goes on as without fingerprints.
	IDReuseLog IDReusePolicy = engine.IDReuseLog
	// IDReuseReject nacks the message with an error wrapping
	// ErrEventIDReused, for a poison queue to take. Without one the message
	// is redelivered forever.
	IDReuseReject IDReusePolicy = engine.IDReuseReject
	// IDReuseIgnore acks the message as a duplicate without logging; only
	// the observer (a metric) sees it.
	IDReuseIgnore IDReusePolicy = engine.IDReuseIgnore
)

// FingerprintStore is implemented by stores that can keep a fingerprint with
// each claim (*sqlinbox.Store with Config.Fingerprints). The middleware uses
// it only when Config.Fingerprint is set.
type FingerprintStore interface {
	// ClaimWithFingerprint is Store.Claim, storing fingerprint (nil: NULL)
	// with a new claim. For a duplicate whose fingerprint is not nil it
	// also returns the fingerprint stored with the original, nil when
	// that one has none; this costs duplicates one more statement.
	ClaimWithFingerprint(ctx context.Context, opts *sql.TxOptions, consumer, eventID string, fingerprint []byte) (tx *sql.Tx, claimed bool, stored []byte, err error)

	// CheckFingerprints returns an error when the store cannot keep
	// fingerprints as configured; NewMiddleware refuses to start with it.
	CheckFingerprints() error
}
