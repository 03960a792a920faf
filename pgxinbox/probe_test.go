package pgxinbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// On native pgx a handler's error is sorted by evidence as on database/sql:
// decoding a truncated payload (io.ErrUnexpectedEOF) and a failed statement
// that aborts the transaction are the handler's own; the server ending the
// claim's connection under the handler, reported as a plain string, is an
// outage the probe of that connection proves.
func TestHandlerErrorsByEvidence(t *testing.T) {
	t.Parallel()
	f := setup(t, sqlinbox.Config{})
	run := func(id string, h func(msg *message.Message, tx pgx.Tx) error) error {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount": 1`))
		msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, id)
		_, err := f.mw(func(msg *message.Message) ([]*message.Message, error) {
			tx, ok := pgxinbox.TxFromContext(msg.Context())
			require.True(t, ok)
			return nil, h(msg, tx)
		})(msg)
		require.Error(t, err)
		return err
	}

	err := run("truncated", func(msg *message.Message, _ pgx.Tx) error {
		var v struct{ Amount int }
		return json.Unmarshal(msg.Payload, &v)
	})
	require.False(t, inbox.IsTransient(err), "%v", err)
	err = run("aborted", func(msg *message.Message, tx pgx.Tx) error {
		_, err := tx.Exec(msg.Context(), `SELEC 1`)
		return err
	})
	require.False(t, inbox.IsTransient(err), "%v", err)
	err = run("terminated", func(msg *message.Message, tx pgx.Tx) error {
		var pid int
		require.NoError(t, tx.QueryRow(msg.Context(), `SELECT pg_backend_pid()`).Scan(&pid))
		pool := f.store.Pool()
		_, err := pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid)
		require.NoError(t, err)
		require.Eventually(t, func() bool { // the server has ended it
			var n int
			return pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n) == nil && n == 0
		}, 10*time.Second, 10*time.Millisecond)
		if _, err := tx.Exec(msg.Context(), `SELECT 1`); err != nil {
			return fmt.Errorf("saving the invoice: %v", err) // the chain lost
		}
		return errors.New("the statement succeeded on a terminated connection")
	})
	require.True(t, inbox.IsTransient(err), "%v", err)
}

// On native pgx as on database/sql (the root package's
// TestHandlerDeadlineDuringAnOutage): a handler's deadline that fires while
// PostgreSQL does not answer is an outage, waited out in place. The same
// deadline with PostgreSQL answering is the handler's own error (the
// conformance suite's HandlerDeadlineIsItsOwn).
func TestHandlerDeadlineDuringAnOutage(t *testing.T) {
	t.Parallel()
	f := setup(t, sqlinbox.Config{})
	dsn, proxy := testdb.Proxied(t, "pgx")
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{Table: f.store.Table()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	require.NoError(t, err)
	conformancetest.DeadlineDuringAnOutage(t, proxy, mw, sqlinbox.PostgreSQL, func(ctx context.Context, query string) error {
		tx, ok := pgxinbox.TxFromContext(ctx)
		if !ok {
			return inbox.ErrNotInInbox
		}
		_, err := tx.Exec(ctx, query)
		return err
	})
}
