package conformancetest

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
)

// Two handlers on one table, one router-level middleware: each handler
// processes each event once, keyed by its own name.
func testConsumersAreIndependent(t *testing.T, target Target) {
	b := setup(t, target)
	ps := pubsub()
	RunRouter(t, func(r *message.Router) {
		r.AddMiddleware(b.middleware(t, inbox.Config{}))
		for _, name := range []string{"invoicing", "analytics"} {
			r.AddConsumerHandler(name, "events", ps, message.NoPublishHandlerFunc(func(msg *message.Message) error {
				return b.writeEffect(msg)
			}))
		}
	})
	events := ids("ev", 5)
	for range 2 {
		for _, id := range events {
			publish(t, ps, "events", newMsg(id))
		}
	}
	want := once("invoicing", events...)
	for k, v := range once("analytics", events...) {
		want[k] = v
	}
	require.Equal(t, want, b.effectCounts(t))
}

// Bad ids: the handler is not called, nothing is written, the error says
// which sentinel.
func testBadEventIDs(t *testing.T, target Target) {
	b := setup(t, target)
	for _, tc := range []struct {
		name    string
		msg     func() *message.Message
		eventID inbox.EventIDFunc
		want    error
	}{
		{"missing metadata key", func() *message.Message { return message.NewMessage(watermill.NewUUID(), nil) },
			inbox.EventIDFromMetadata("id"), inbox.ErrMissingEventID},
		{"no metadata and no UUID", func() *message.Message { return message.NewMessage("", nil) },
			nil, inbox.ErrMissingEventID},
		{"empty", func() *message.Message {
			m := message.NewMessage(watermill.NewUUID(), nil)
			m.Metadata.Set("id", "")
			return m
		}, inbox.EventIDFromMetadata("id"), inbox.ErrInvalidEventID},
		{"oversized", func() *message.Message { return newMsg(strings.Repeat("x", inbox.MaxEventIDLength+1)) }, nil, inbox.ErrInvalidEventID},
		{"NUL byte", func() *message.Message { return newMsg("a\x00b") }, nil, inbox.ErrInvalidEventID},
		{"invalid UTF-8", func() *message.Message { return newMsg("a\xffb") }, nil, inbox.ErrInvalidEventID},
		{"JSON payload without the field", func() *message.Message { return message.NewMessage(watermill.NewUUID(), []byte(`{"other":1}`)) },
			inbox.EventIDFromJSONField("event_id"), inbox.ErrMissingEventID},
		{"JSON payload not an object", func() *message.Message { return message.NewMessage(watermill.NewUUID(), []byte(`[1]`)) },
			inbox.EventIDFromJSONField("event_id"), inbox.ErrMissingEventID},
		{"JSON id is a float", func() *message.Message { return message.NewMessage(watermill.NewUUID(), []byte(`{"event_id":1.5}`)) },
			inbox.EventIDFromJSONField("event_id"), inbox.ErrInvalidEventID},
		{"user function fails", func() *message.Message { return newMsg("x") },
			func(*message.Message) (string, error) { return "", errors.New("cannot parse") }, inbox.ErrMissingEventID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw := b.middleware(t, inbox.Config{Consumer: "c", EventID: tc.eventID})
			called := false
			_, err := call(mw, func(*message.Message) ([]*message.Message, error) {
				called = true
				return nil, nil
			}, tc.msg())
			require.ErrorIs(t, err, tc.want)
			require.False(t, called, "handler called")
		})
	}
	require.Zero(t, b.claims(t))

	// The longest valid id and multi-byte UTF-8 are stored exactly.
	long := strings.Repeat("é", inbox.MaxEventIDLength/2)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	for _, id := range []string{long, long, "ünï-çødé", "ünï-çødé", "Case", "case", "trailing ", "trailing"} {
		_, err := call(mw, b.handler(nil), newMsg(id))
		require.NoError(t, err)
	}
	require.Equal(t, once("c", long, "ünï-çødé", "Case", "case", "trailing ", "trailing"), b.effectCounts(t))

	// Ids from a JSON payload field.
	mw = b.middleware(t, inbox.Config{Consumer: "json", EventID: inbox.EventIDFromJSONField("event_id")})
	for _, payload := range []string{`{"event_id":"e-1"}`, `{"event_id":"e-1","x":2}`, `{"event_id":7}`, `{"event_id":7}`} {
		_, err := call(mw, b.handler(nil), message.NewMessage(watermill.NewUUID(), []byte(payload)))
		require.NoError(t, err)
	}
	require.Equal(t, 1, b.effectCounts(t)["json/e-1"])
	require.Equal(t, 1, b.effectCounts(t)["json/7"])
}

// Outside a router there is no handler name: without Config.Consumer the
// message is refused, not keyed by "".
func testNoConsumer(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{})
	_, err := call(mw, b.handler(nil), newMsg("x"))
	require.ErrorIs(t, err, inbox.ErrNoConsumer)
	require.Zero(t, b.claims(t))
}
