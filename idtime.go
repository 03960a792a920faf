package inbox

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
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
// The time is the producer's clock when it made the id: a producer whose
// clock is off gives its events a time that is off by as much.
func TimeInEventID(id string) (time.Time, bool) {
	at, err := ParseTimeInEventID(id)
	return at, err == nil
}

// ParseTimeInEventID is [TimeInEventID] with the reason an id carries no
// time. An id of a ULID's shape, 26 letters and digits, is an invalid ULID
// when a letter is outside Crockford's base32 (I, L, O, U) or the first
// character is above 7, and the error says which character and where: such
// an id was meant as a ULID, and "carries no time" would hide the typo. The
// error does not quote id, for the caller to quote it its own way.
func ParseTimeInEventID(id string) (time.Time, error) {
	var ms int64
	switch {
	case len(id) == 36:
		// xxxxxxxx-xxxx-7xxx-Vxxx-xxxxxxxxxxxx: the first 48 bits are the
		// Unix time in milliseconds, version 7, variant 10 (V is 8-b).
		if id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' || id[14] != '7' {
			return time.Time{}, errNoTime
		}
		if v := hexValue(id[19]); v < 8 || v > 11 {
			return time.Time{}, errNoTime
		}
		for i := range 36 {
			if i == 8 || i == 13 || i == 18 || i == 23 {
				continue
			}
			v := hexValue(id[i])
			if v < 0 {
				return time.Time{}, errNoTime
			}
			if i < 13 {
				ms = ms<<4 | int64(v)
			}
		}
	case len(id) == 26 && strings.IndexFunc(id, func(r rune) bool { return !isASCIIAlnum(r) }) < 0:
		// The first 10 characters are the 48-bit Unix time in
		// milliseconds, so the first is at most 7.
		for i := range 26 {
			v := base32Value(id[i])
			if v < 0 {
				return time.Time{}, fmt.Errorf("is not a valid ULID: %q at position %d is not in its alphabet (Crockford's base32 has no I, L, O or U)", id[i], i+1)
			}
			if i == 0 && v > 7 {
				return time.Time{}, fmt.Errorf("is not a valid ULID: its first character, %c, is above 7: the time would not fit in 48 bits", id[0])
			}
			if i < 10 {
				ms = ms<<5 | int64(v)
			}
		}
	default:
		return time.Time{}, errNoTime
	}
	return time.UnixMilli(ms).UTC(), nil
}

var errNoTime = errors.New("carries no time (a UUIDv7 or a ULID does)")

func isASCIIAlnum(r rune) bool {
	return r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
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

func hexValue(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// crockford is the alphabet of ULIDs: base32 without I, L, O and U.
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

func base32Value(c byte) int {
	if c >= 'a' && c <= 'z' {
		c -= 'a' - 'A'
	}
	for i := range len(crockford) {
		if crockford[i] == c {
			return i
		}
	}
	return -1
}
