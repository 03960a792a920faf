//lint:file-ignore SA4006 docs/reliability.md's snippet shows the calls without their error checks, which the test adds after it

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
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// docs/reliability.md's fingerprints: a second event under a processed id
// is nacked with inbox.ErrEventIDReused, and its handler does not run.
func TestReliabilityReusedEventIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sql.Open("pgx", schemaDSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })

	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Fingerprints: true})
	mw, err := inbox.NewMiddleware(inbox.Config{
		Store:       store,
		Fingerprint: inbox.PayloadFingerprint, // SHA-256 of the payload
		OnIDReuse:   inbox.IDReuseReject,      // nack with inbox.ErrEventIDReused, for a poison queue
	})

	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	p := newPipeline(t)
	errs := make(chan error, 10)
	p.router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			_, err := h(msg)
			errs <- err
			return nil, nil // acked: the test looks at the error only
		}
	})
	runs := 0
	p.router.AddConsumerHandler("billing", "orders", p.pubSub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		runs++
		_, ok := inbox.TxFromContext(msg.Context())
		require.True(t, ok)
		return nil
	}))
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = p.router.Run(runCtx) }()
	<-p.router.Running()
	for _, payload := range []string{`{"amount":10}`, `{"amount":99}`} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
		msg.Metadata.Set("event_id", "order-1")
		require.NoError(t, p.pubSub.Publish("orders", msg))
		select {
		case err = <-errs:
		case <-time.After(10 * time.Second):
			t.Fatal("no outcome")
		}
	}
	require.True(t, errors.Is(err, inbox.ErrEventIDReused), "%v", err)
	require.Equal(t, 1, runs)
}
