package conformancetest

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// UUID mode: non-UUIDs are refused before any SQL; case variants of one
// UUID are one event.
func testUUIDEventIDs(t *testing.T, target Target) {
	skipReadableIDs(t, target, "it needs ids that are not UUIDs to reach the store")
	b := setup(t, target, func(c *sqlinbox.Config) { c.UUIDEventIDs = true })
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	id := "0b5a3c9e-1f2d-4e5f-8a9b-0c1d2e3f4a5b"
	for _, v := range []string{id, strings.ToUpper(id), id} {
		_, err := call(mw, b.handler(nil), newMsg(v))
		require.NoError(t, err)
	}
	for _, bad := range []string{"order-1", "0b5a3c9e1f2d4e5f8a9b0c1d2e3f4a5b", "{" + id + "}", id + " "} {
		_, err := call(mw, b.handler(nil), newMsg(bad))
		require.ErrorIs(t, err, inbox.ErrInvalidEventID, bad)
	}
	require.Equal(t, once("c", id), b.effectCounts(t))
	require.Equal(t, 1, b.claims(t))
}

// CreateSchema runs again, and from several goroutines at once, without
// error.
func testSchemaIdempotent(t *testing.T, target Target) {
	b := setup(t, target)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	table := b.store.Table() + "_fresh"
	t.Cleanup(func() {
		_, _ = b.db.Exec("DROP TABLE IF EXISTS " + table)
		_, _ = b.db.Exec("DROP TABLE IF EXISTS " + table + "_leases")
	})
	for range 4 {
		wg.Go(func() {
			s, err := sqlinbox.New(target.Open(t), sqlinbox.Config{Dialect: target.Dialect, Table: table, Partitioning: target.Partitioning, TransactionPooling: target.TransactionPooling})
			if err == nil {
				err = s.CreateSchema(context.Background())
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, b.store.CreateSchema(context.Background()))
	require.Contains(t, b.store.SchemaSQL(), "processed_at")
}
