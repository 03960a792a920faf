package conformancetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/clock"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// outcomes records every observed outcome, in order, from any goroutine.
type outcomes struct {
	mu       sync.Mutex
	got      []observe.Outcome
	warnings []observe.Warning
}

func (o *outcomes) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(ob observe.Observation) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.got = append(o.got, ob.Outcome)
		o.warnings = append(o.warnings, ob.Warning)
	}
}

// warned returns how many messages carried warning w.
func (o *outcomes) warned(w observe.Warning) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, got := range o.warnings {
		if got == w {
			n++
		}
	}
	return n
}

// count returns how many times outcome was observed.
func (o *outcomes) count(outcome observe.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, got := range o.got {
		if got == outcome {
			n++
		}
	}
	return n
}

func payloadMsg(id, payload string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, id)
	return msg
}

// An event id arriving again with another payload is reported per
// OnIDReuse; the same payload is a plain duplicate; the handler never runs
// twice.
func testIDReuse(t *testing.T, target Target) {
	b := setup(t, target, func(c *sqlinbox.Config) { c.Fingerprints = true })
	obs := &outcomes{}
	reject := b.middleware(t, inbox.Config{Consumer: "c", Fingerprint: inbox.PayloadFingerprint, OnIDReuse: inbox.IDReuseReject, Observer: obs})
	logger := watermill.NewCaptureLogger()
	logged := b.middleware(t, inbox.Config{Consumer: "c", Fingerprint: inbox.PayloadFingerprint, Logger: logger, Observer: obs})
	h := b.handler(nil)

	_, err := call(reject, h, payloadMsg("ev-1", `{"n":1}`))
	require.NoError(t, err)
	_, err = call(reject, h, payloadMsg("ev-1", `{"n":1}`))
	require.NoError(t, err, "same id, same payload: a duplicate")
	_, err = call(reject, h, payloadMsg("ev-1", `{"n":2}`))
	require.ErrorIs(t, err, inbox.ErrEventIDReused)
	_, err = call(logged, h, payloadMsg("ev-1", `{"n":3}`))
	require.NoError(t, err, "IDReuseLog acks")
	require.Len(t, logger.Captured()[watermill.ErrorLogLevel], 1)
	require.ErrorIs(t, logger.Captured()[watermill.ErrorLogLevel][0].Err, inbox.ErrEventIDReused)
	require.Equal(t, []observe.Outcome{observe.Processed, observe.Duplicate, observe.IDReused, observe.IDReused}, obs.got)

	// Without Fingerprint in the middleware nothing is written to the
	// column, and a fingerprinted copy later is a duplicate, not a reuse.
	plain := b.middleware(t, inbox.Config{Consumer: "c"})
	_, err = call(plain, h, payloadMsg("ev-2", `{"n":1}`))
	require.NoError(t, err)
	_, err = call(reject, h, payloadMsg("ev-2", `{"n":2}`))
	require.NoError(t, err)

	require.Equal(t, once("c", "ev-1", "ev-2"), b.effectCounts(t))
	var withFP int
	require.NoError(t, b.db.QueryRow(fmt.Sprintf(`SELECT COUNT(*) FROM %s WHERE fingerprint IS NOT NULL`, b.store.Table())).Scan(&withFP))
	require.Equal(t, 1, withFP, "only ev-1 was claimed with a fingerprint")

	// A store without the column refuses the configuration.
	plainStore := setup(t, target)
	_, err = plainStore.middlewareOn(t, plainStore.config, inbox.Config{Fingerprint: inbox.PayloadFingerprint})
	require.ErrorContains(t, err, "Fingerprints")
}

// A table made before fingerprints gets the column through
// AddFingerprintColumnSQL; its old rows (NULL) are plain duplicates.
func testIDReuseLegacyRows(t *testing.T, target Target) {
	skipReadableIDs(t, target, "it writes inbox rows by their readable ids")
	b := setup(t, target, func(c *sqlinbox.Config) { c.UUIDEventIDs = true })
	id := "0b5a3c9e-1f2d-4e5f-8a9b-0c1d2e3f4a5b"
	_, err := call(b.middleware(t, inbox.Config{Consumer: "c"}), b.handler(nil), payloadMsg(id, "old"))
	require.NoError(t, err)

	_, err = b.db.Exec(b.store.AddFingerprintColumnSQL())
	require.NoError(t, err)
	cfg := b.config
	cfg.Fingerprints = true
	mw, err := b.middlewareOn(t, cfg, inbox.Config{Consumer: "c", Fingerprint: inbox.PayloadFingerprint, OnIDReuse: inbox.IDReuseReject})
	require.NoError(t, err)

	_, err = call(mw, b.handler(nil), payloadMsg(id, "new payload"))
	require.NoError(t, err, "a row without a fingerprint never mismatches")
	// In UUID mode the fingerprint lookup finds ids spelled differently.
	other := "1b5a3c9e-1f2d-4e5f-8a9b-0c1d2e3f4a5b"
	_, err = call(mw, b.handler(nil), payloadMsg(other, "a"))
	require.NoError(t, err)
	_, err = call(mw, b.handler(nil), payloadMsg(strings.ToUpper(other), "b"))
	require.ErrorIs(t, err, inbox.ErrEventIDReused)
	require.Equal(t, once("c", id, other), b.effectCounts(t))
}

// Stale events are rejected or skipped before any SQL, or processed.
func testStaleEvents(t *testing.T, target Target) {
	b := setup(t, target)
	old := func(id string) *message.Message {
		msg := newMsg(id)
		msg.Metadata.Set("event_time", clock.Now().Add(-48*time.Hour).Format(time.RFC3339Nano))
		return msg
	}
	cfg := func(p inbox.StalePolicy) inbox.Config {
		return inbox.Config{Consumer: "c", MaxEventAge: 24 * time.Hour, EventTime: inbox.EventTimeFromMetadata("event_time"), StaleEvents: p}
	}
	_, err := call(b.middleware(t, cfg(inbox.StaleReject)), b.handler(nil), old("rejected"))
	require.ErrorIs(t, err, inbox.ErrStaleEvent)
	_, err = call(b.middleware(t, cfg(inbox.StaleSkip)), b.handler(nil), old("skipped"))
	require.NoError(t, err)
	require.Equal(t, 0, b.claims(t), "nothing written for rejected or skipped events")

	process := b.middleware(t, cfg(inbox.StaleProcess))
	fresh := newMsg("fresh")
	fresh.Metadata.Set("event_time", clock.Now().Format(time.RFC3339Nano))
	for _, msg := range []*message.Message{old("processed"), old("processed"), fresh, newMsg("untimed")} {
		_, err = call(process, b.handler(nil), msg)
		require.NoError(t, err)
	}
	_, err = call(b.middleware(t, cfg(inbox.StaleReject)), b.handler(nil), fresh.Copy())
	require.NoError(t, err, "a fresh duplicate is a duplicate")
	require.Equal(t, once("c", "processed", "fresh", "untimed"), b.effectCounts(t))
}

// OldestClaim reads the oldest processed_at, partitions included.
func testOldestClaim(t *testing.T, target Target) {
	skipReadableIDs(t, target, "it writes inbox rows by their readable ids")
	b := setup(t, target)
	ctx := context.Background()
	_, ok, err := b.store.OldestClaim(ctx)
	require.NoError(t, err)
	require.False(t, ok, "empty table")

	_, err = call(b.middleware(t, inbox.Config{Consumer: "c"}), b.handler(nil), newMsg("new"))
	require.NoError(t, err)
	old := time.Date(2001, 2, 3, 4, 5, 6, 789e6, time.UTC)
	var at any = old
	if target.ProcessedAt != nil {
		at = target.ProcessedAt(old)
	}
	_, err = b.db.Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at) VALUES (%s, %s, %s)`,
		b.store.Table(), b.target.Placeholder(1), b.target.Placeholder(2), b.target.Placeholder(3)), "c", "old", at)
	require.NoError(t, err)
	got, ok, err := b.store.OldestClaim(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, old, got)

	_, err = b.db.Exec(fmt.Sprintf(`DELETE FROM %s WHERE event_id = %s`, b.store.Table(), b.target.Placeholder(1)), "old")
	require.NoError(t, err)
	got, ok, err = b.store.OldestClaim(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, got.After(old), "the claim made now: %s", got)
}
