package inbox_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
)

func TestDefaultEventID(t *testing.T) {
	t.Parallel()
	msg := message.NewMessage("uuid-1", nil)
	id, err := inbox.DefaultEventID(msg)
	require.NoError(t, err)
	require.Equal(t, "uuid-1", id)

	msg.Metadata.Set("event_id", "ev-1")
	id, err = inbox.DefaultEventID(msg)
	require.NoError(t, err)
	require.Equal(t, "ev-1", id, "metadata wins over the envelope UUID")

	_, err = inbox.DefaultEventID(message.NewMessage("", nil))
	require.ErrorIs(t, err, inbox.ErrMissingEventID)
}

func TestEventIDFromJSONField(t *testing.T) {
	t.Parallel()
	get := inbox.EventIDFromJSONField("event_id")
	for payload, want := range map[string]string{
		`{"event_id":"a-1"}`:                       "a-1",
		`{"event_id":123456789012345678}`:          "123456789012345678",
		`{"x":{"event_id":"no"},"event_id":"yes"}`: "yes",
	} {
		id, err := get(message.NewMessage("u", []byte(payload)))
		require.NoError(t, err, payload)
		require.Equal(t, want, id, payload)
	}
	for payload, want := range map[string]error{
		``:                     inbox.ErrMissingEventID,
		`not json`:             inbox.ErrMissingEventID,
		`{"event_id":null}`:    inbox.ErrMissingEventID,
		`{"event_id":true}`:    inbox.ErrInvalidEventID,
		`{"event_id":{"a":1}}`: inbox.ErrInvalidEventID,
		`{"event_id":1e3}`:     inbox.ErrInvalidEventID,
	} {
		_, err := get(message.NewMessage("u", []byte(payload)))
		require.ErrorIs(t, err, want, payload)
	}
}

func TestValidateEventID(t *testing.T) {
	t.Parallel()
	require.NoError(t, inboxdriver.ValidateEventID("x"))
	require.NoError(t, inboxdriver.ValidateEventID(strings.Repeat("é", inbox.MaxEventIDLength/2)))
	for _, bad := range []string{"", strings.Repeat("x", inbox.MaxEventIDLength+1), "a\x00", "\xc3\x28"} {
		err := inboxdriver.ValidateEventID(bad)
		require.ErrorIs(t, err, inbox.ErrInvalidEventID, "%q", bad)
		require.LessOrEqual(t, len(err.Error()), 200, "the error quotes a truncated id")
	}
}

// FuzzValidateEventID checks that whatever ValidateEventID accepts is
// storable on every dialect: non-empty, bounded, valid UTF-8, no NUL.
func FuzzValidateEventID(f *testing.F) {
	for _, seed := range []string{"", "x", "order-42", "0b5a3c9e-1f2d-4e5f-8a9b-0c1d2e3f4a5b", "a\x00b", "\xff",
		"ünï-çødé", strings.Repeat("x", 255), strings.Repeat("x", 256), strings.Repeat("é", 128), "trailing ", "\t\n"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := inboxdriver.ValidateEventID(id)
		ok := id != "" && len(id) <= inbox.MaxEventIDLength && utf8.ValidString(id) && !strings.ContainsRune(id, 0)
		if ok != (err == nil) {
			t.Fatalf("ValidateEventID(%q) = %v, want ok=%v", id, err, ok)
		}
		if err != nil && !errors.Is(err, inbox.ErrInvalidEventID) {
			t.Fatalf("error does not wrap ErrInvalidEventID: %v", err)
		}
	})
}

// FuzzEventIDFromJSONField: any payload yields an id, ErrMissingEventID or
// ErrInvalidEventID, never a panic or another error.
func FuzzEventIDFromJSONField(f *testing.F) {
	for _, seed := range []string{`{"event_id":"a"}`, `{"event_id":1}`, `{"event_id":1.5}`, `{"event_id":null}`, `[]`, ``, `{"event_id":"\u0000"}`, `{"event_id":-0}`} {
		f.Add([]byte(seed))
	}
	get := inbox.EventIDFromJSONField("event_id")
	f.Fuzz(func(t *testing.T, payload []byte) {
		_, err := get(message.NewMessage("u", payload))
		if err != nil && !errors.Is(err, inbox.ErrMissingEventID) && !errors.Is(err, inbox.ErrInvalidEventID) {
			t.Fatalf("unexpected error kind: %v", err)
		}
	})
}

func TestNewMiddlewareValidatesConfig(t *testing.T) {
	t.Parallel()
	_, err := inbox.NewMiddleware(inbox.Config{})
	require.ErrorContains(t, err, "Store")
	for _, bad := range []string{"a\x00b", "tab\there", strings.Repeat("c", 256), "\xff"} {
		_, err := inbox.NewMiddleware(inbox.Config{Store: nopStore{}, Consumer: bad})
		require.ErrorContains(t, err, "Consumer", "%q", bad)
	}
	_, err = inbox.NewMiddleware(inbox.Config{Store: nopStore{}, Consumer: "billing v2/eu"})
	require.NoError(t, err)
	_, err = inbox.NewMiddleware(inbox.Config{Store: nopStore{}, Service: strings.Repeat("s", 256)})
	require.ErrorContains(t, err, "inbox: invalid config: Service: service name is 256 bytes")
}
