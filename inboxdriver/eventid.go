package inboxdriver

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/watermill-inbox/inbox/internal/errtext"
)

// MaxEventIDLength is the longest event id accepted, in bytes: the width of
// the event_id column on every dialect.
const MaxEventIDLength = 255

// ErrInvalidEventID means the event id is empty, longer than
// [MaxEventIDLength] bytes, not valid UTF-8, contains a NUL byte, or does
// not fit the store's column.
var ErrInvalidEventID = errors.New("inbox: invalid event id")

// ErrInvalidShardKey means a claim's shard key does not fit the store: empty
// or too long for a table with a shard key column, set for one without.
var ErrInvalidShardKey = errors.New("inbox: invalid shard key")

// ValidateEventID reports whether id can be stored: non-empty, at most
// [MaxEventIDLength] bytes, valid UTF-8, no NUL byte (PostgreSQL text
// cannot hold one, and other databases would accept what PostgreSQL
// rejects). The error wraps [ErrInvalidEventID] and quotes the id.
func ValidateEventID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrInvalidEventID)
	case len(id) > MaxEventIDLength:
		return fmt.Errorf("%w: %d bytes, at most %d allowed: %s", ErrInvalidEventID, len(id), MaxEventIDLength, errtext.Quote(id))
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not valid UTF-8: %s", ErrInvalidEventID, errtext.Quote(id))
	case strings.IndexByte(id, 0) >= 0:
		return fmt.Errorf("%w: contains a NUL byte: %s", ErrInvalidEventID, errtext.Quote(id))
	}
	return nil
}

// EventIDTime returns the creation time an event id carries: a UUIDv7 in
// its hyphenated form or a ULID, either case, to the millisecond. An id of
// a ULID's shape with a letter outside Crockford's base32 (I, L, O, U), or
// a first character above 7, is an invalid ULID, and the error says which
// character and where: such an id was meant as a ULID, and "carries no
// time" would hide the typo. The error does not quote id.
func EventIDTime(id string) (time.Time, error) {
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
