package sqlinbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// TestClaimBatchCancelledReleasesLock ends the context of MySQL batches at
// random points of their claims (a shutdown, a deadline): none leaves the
// consumer's named lock held by a pooled connection, so another replica's
// batch then claims within its one-second claim timeout.
func TestClaimBatchCancelledReleasesLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.MySQL(t)
	table := testdb.Table(t, db, "inbox")
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: table})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	other, err := sqlinbox.New(testdb.MySQL(t), sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: table, ClaimTimeout: time.Second})
	require.NoError(t, err)

	cancelled := 0
	for i := range 300 {
		bctx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(8000))*time.Microsecond)
		tx, _, err := store.ClaimBatch(bctx, inboxdriver.BatchClaim{Consumer: "c", EventIDs: batchIDs(fmt.Sprint(t.Name(), i), 200)})
		if err != nil {
			cancelled++
		} else if tx != nil {
			_ = tx.Rollback(ctx)
		}
		cancel()
	}
	require.NotZero(t, cancelled, "no batch was cancelled during its claim")
	t.Logf("%d of 300 batches cancelled", cancelled)

	tx, claimed, err := other.ClaimBatch(ctx, inboxdriver.BatchClaim{Consumer: "c", EventIDs: batchIDs(t.Name()+"other", 3)})
	require.NoError(t, err, "a cancelled batch left the consumer's lock behind")
	require.Equal(t, []bool{true, true, true}, claimed)
	require.NoError(t, tx.Rollback(ctx))
}
