package inbox_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
)

func TestTimeInEventID(t *testing.T) {
	before := time.Now().Truncate(time.Millisecond)
	v7 := uuid.Must(uuid.NewV7()).String()
	ulid := watermill.NewULID()
	after := time.Now()
	for _, id := range []string{v7, strings.ToUpper(v7), ulid, strings.ToLower(ulid)} {
		at, ok := inbox.TimeInEventID(id)
		if !ok || at.Before(before) || at.After(after) || at.Location() != time.UTC {
			t.Errorf("TimeInEventID(%q) = %v, %v; want a UTC time in [%v, %v]", id, at, ok, before, after)
		}
	}
	// Fixed vectors: RFC 9562's UUIDv7 example, and a ULID of the same
	// millisecond (0x017F22E279B0 = 1645557742000).
	want := time.UnixMilli(1645557742000).UTC()
	for _, id := range []string{"017f22e2-79b0-7cc3-98c4-dc0c0c07398f", "01FWHE4YDG0000000000000000"} {
		if at, ok := inbox.TimeInEventID(id); !ok || !at.Equal(want) {
			t.Errorf("TimeInEventID(%q) = %v, %v; want %v", id, at, ok, want)
		}
	}
	for _, id := range []string{
		"",
		watermill.NewUUID(),                    // v4: no time
		"017f22e2-79b0-6cc3-98c4-dc0c0c07398f", // v6
		"017f22e2-79b0-7cc3-c8c4-dc0c0c07398f", // variant 110
		"017f22e2-79b0-7cc3-98c4-dc0c0c07398g", // not hex
		"017f22e279b07cc398c4dc0c0c07398f",     // no hyphens
		"81FWHE4YDG0000000000000000",           // beyond 48 bits
		"01FWHE4YDG000000000000000U",           // U is not Crockford's
		"order-1234",
	} {
		if at, ok := inbox.TimeInEventID(id); ok {
			t.Errorf("TimeInEventID(%q) = %v, true; want false", id, at)
		}
	}
}

// An id of a ULID's shape with a character a ULID cannot hold is an
// invalid ULID, and the error names the character and its position; other
// ids without a time carry none.
func TestParseTimeInEventID(t *testing.T) {
	for id, want := range map[string]string{
		"01FWHE4YDG000000000000000U": "is not a valid ULID: 'U' at position 26 is not in its alphabet (Crockford's base32 has no I, L, O or U)",
		"I1FWHE4YDG0000000000000000": "is not a valid ULID: 'I' at position 1 is not in its alphabet",
		"01fwhe4ydgo000000000000000": "is not a valid ULID: 'o' at position 11 is not in its alphabet",
		"01FWHE4YDG00000000000000L0": "is not a valid ULID: 'L' at position 25",
		"81FWHE4YDG0000000000000000": "is not a valid ULID: its first character, 8, is above 7: the time would not fit in 48 bits",
		"order-1234567890123456789X": "carries no time (a UUIDv7 or a ULID does)", // 26 bytes, not a ULID's shape
		"01FWHE4YDG00000000000000é":  "carries no time",
		watermill.NewUUID():          "carries no time",
		"":                           "carries no time",
	} {
		at, err := inboxdriver.EventIDTime(id)
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("ParseTimeInEventID(%q) = %v, %v; want an error starting %q", id, at, err, want)
		}
	}
	at, err := inboxdriver.EventIDTime("01fwhe4ydg0000000000000000")
	if err != nil || at.UnixMilli() != 1645557742000 {
		t.Errorf("got %v, %v", at, err)
	}
}

func TestEventTimeFromEventID(t *testing.T) {
	fn := inbox.EventTimeFromEventID(inbox.DefaultEventID)
	msg := message.NewMessage("017f22e2-79b0-7cc3-98c4-dc0c0c07398f", nil)
	if at, ok := fn(msg); !ok || at.UnixMilli() != 1645557742000 {
		t.Errorf("got %v, %v", at, ok)
	}
	if _, ok := fn(message.NewMessage(watermill.NewUUID(), nil)); ok {
		t.Error("a UUIDv4 id gave a time")
	}
	if _, ok := fn(message.NewMessage("", nil)); ok {
		t.Error("a message without an id gave a time")
	}
}
