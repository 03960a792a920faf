package inbox_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
)

func timedMsg(age time.Duration) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	msg.Metadata.Set("event_time", testdb.Now().Add(-age).Format(time.RFC3339Nano))
	return msg
}

// Each policy decides before any SQL: nopStore fails every claim, so only
// StaleProcess and fresh events reach it.
func TestStalePolicies(t *testing.T) {
	t.Parallel()
	const refused = "nopStore does not claim"
	for _, tc := range []struct {
		name    string
		policy  inbox.StalePolicy
		age     time.Duration
		wantErr error // errors.Is
		claimed bool  // the store was asked (its refusal is the error)
		outcome observe.Outcome
		level   watermill.LogLevel // one line logged at this level
	}{
		{"reject", inbox.StaleReject, 2 * time.Hour, inbox.ErrStaleEvent, false, observe.Stale, 0},
		{"skip", inbox.StaleSkip, 2 * time.Hour, nil, false, observe.Stale, watermill.ErrorLogLevel},
		{"process", inbox.StaleProcess, 2 * time.Hour, nil, true, observe.ClaimFailed, watermill.InfoLogLevel},
		{"fresh", inbox.StaleReject, time.Minute, nil, true, observe.ClaimFailed, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{}
			logger := watermill.NewCaptureLogger()
			mw, err := inbox.NewMiddleware(inbox.Config{
				Store: nopStore{}, Consumer: "c", Observer: rec, Logger: logger,
				MaxEventAge: time.Hour, EventTime: inbox.EventTimeFromMetadata("event_time"), StaleEvents: tc.policy,
			})
			require.NoError(t, err)
			called := false
			_, err = mw(func(*message.Message) ([]*message.Message, error) { called = true; return nil, nil })(timedMsg(tc.age))
			switch {
			case tc.wantErr != nil:
				require.ErrorIs(t, err, tc.wantErr)
			case tc.claimed:
				require.ErrorContains(t, err, refused)
			default:
				require.NoError(t, err)
			}
			require.False(t, called)
			require.Equal(t, []observe.Outcome{tc.outcome}, rec.outcomes())
			// Every policy marks a stale event, StaleProcess included,
			// whose outcome alone would not show it.
			require.Equal(t, tc.age > time.Hour, rec.obs[0].Stale)
			if tc.level != 0 {
				require.Len(t, logger.Captured()[tc.level], 1)
			}
		})
	}
}

func TestStaleConfig(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]inbox.Config{
		"MaxEventAge needs EventTime": {Store: nopStore{}, MaxEventAge: time.Hour},
		"MaxEventAge is negative":     {Store: nopStore{}, MaxEventAge: -time.Hour, EventTime: inbox.EventTimeFromMetadata("t")},
		"StaleEvents: unknown":        {Store: nopStore{}, StaleEvents: 7},
		"OnIDReuse: unknown":          {Store: nopStore{}, OnIDReuse: 7},
		"cannot keep fingerprints":    {Store: nopStore{}, Fingerprint: inbox.PayloadFingerprint},
	} {
		_, err := inbox.NewMiddleware(cfg)
		require.ErrorContains(t, err, name)
	}
}

func TestEventTimeReaders(t *testing.T) {
	t.Parallel()
	read := inbox.EventTimeFromMetadata("event_time")
	msg := message.NewMessage("m", nil)
	_, ok := read(msg)
	require.False(t, ok, "missing")
	msg.Metadata.Set("event_time", "yesterday")
	_, ok = read(msg)
	require.False(t, ok, "unparsable")
	msg.Metadata.Set("event_time", "2026-01-02T03:04:05.123+01:00")
	at, ok := read(msg)
	require.True(t, ok)
	require.Equal(t, time.Date(2026, 1, 2, 2, 4, 5, 123e6, time.UTC), at.UTC())

	type key struct{}
	fromCtx := inbox.EventTimeFromContext(func(ctx context.Context) (time.Time, bool) {
		at, ok := ctx.Value(key{}).(time.Time)
		return at, ok
	})
	msg.SetContext(context.WithValue(context.Background(), key{}, at))
	got, ok := fromCtx(msg)
	require.True(t, ok)
	require.Equal(t, at, got)
}

func TestFingerprints(t *testing.T) {
	t.Parallel()
	msg := message.NewMessage("m", []byte("payload"))
	sum := sha256.Sum256([]byte("payload"))
	require.Equal(t, sum[:], inbox.PayloadFingerprint(msg))

	fp := inbox.PayloadAndMetadataFingerprint("type")
	a := fp(msg)
	msg.Metadata.Set("partition", "3") // not listed: no change
	require.Equal(t, a, fp(msg))
	msg.Metadata.Set("type", "v2")
	require.NotEqual(t, a, fp(msg))
	require.LessOrEqual(t, len(a), inbox.MaxFingerprintLength)
}
