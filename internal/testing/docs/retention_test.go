//lint:file-ignore SA4006 docs/retention.md's snippets show the calls without their error checks, which the tests add after them

package docs_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// docs/retention.md's purge: a loop, a round and a dry run on one table.
func TestRetentionPurge(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, err := sql.Open("pgx", schemaDSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	_, err = db.Exec(`INSERT INTO watermill_inbox (consumer, event_id, processed_at) VALUES ('billing', 'old', now() - interval '15 days')`)
	require.NoError(t, err)
	logger := watermill.NopLogger{}

	p, err := purge.New(store, purge.Config{
		Retention:         14 * 24 * time.Hour,                                    // > broker retention + retries
		ConsumerRetention: map[string]time.Duration{"audit": 90 * 24 * time.Hour}, // optional, per consumer
		Logger:            logger,                                                 // one line per round
	})
	go p.Run(ctx)                // a round now, then every Interval (10 min); returns nil when ctx ends
	n, err := p.PurgeOnce(ctx)   // or one round: rows removed
	counts, err := p.DryRun(ctx) // rows a round would remove now, per consumer

	// The loop's first round may hold the purge lock meanwhile, and may
	// have removed the row first.
	if !errors.Is(err, purge.ErrSkipped) {
		require.NoError(t, err)
		require.Empty(t, counts)
	}
	require.LessOrEqual(t, n, int64(1))
	require.Eventually(t, func() bool {
		counts, err := p.DryRun(ctx)
		return err == nil && len(counts) == 0
	}, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return countRows(t, db, "watermill_inbox")() == 0 }, 10*time.Second, 20*time.Millisecond)
}

// docs/retention.md's stale events: an event older than MaxEventAge is
// nacked with inbox.ErrStaleEvent, and its handler does not run.
func TestRetentionStaleEvents(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))

	mw, err := inbox.NewMiddleware(inbox.Config{
		Store:       store,
		MaxEventAge: 10 * 24 * time.Hour,                       // below the purge retention (14 days here)
		EventTime:   inbox.EventTimeFromMetadata("event_time"), // RFC 3339, written by the producer
		StaleEvents: inbox.StaleReject,                         // nack with inbox.ErrStaleEvent, for a poison queue
	})

	require.NoError(t, err)
	p := newPipeline(t)
	errs := make(chan error, 10)
	p.router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			_, err := h(msg)
			if err != nil {
				errs <- err
			}
			return nil, nil // acked: the test looks at the error only
		}
	})
	ran := false
	p.router.AddConsumerHandler("billing", "orders", p.pubSub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		ran = true
		return nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.router.Run(ctx) }()
	<-p.router.Running()
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	msg.Metadata.Set("event_time", time.Now().Add(-11*24*time.Hour).Format(time.RFC3339))
	require.NoError(t, p.pubSub.Publish("orders", msg))
	select {
	case err := <-errs:
		require.True(t, errors.Is(err, inbox.ErrStaleEvent), "%v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the stale event was not refused")
	}
	require.False(t, ran)
}

// docs/retention.md's two partition layouts on PostgreSQL.
func TestRetentionPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sql.Open("pgx", schemaDSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })

	// Event ids that carry their time (UUIDv7, ULID): the fast layout.
	byEventTime, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Daily,
		PartitionKey: sqlinbox.EventIDTime, UUIDEventIDs: true})
	// Any event id: partitions of processed_at.
	byProcessedAt, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Monthly})
	err = byEventTime.CreateSchema(ctx) // the table, the current period's partition, the next 3, and a DEFAULT partition

	require.NoError(t, err)
	require.Len(t, testdb.TimePartitions(t, db, "watermill_inbox"), 4)
	require.Contains(t, byProcessedAt.SchemaSQL(), "PARTITION BY RANGE")
}
