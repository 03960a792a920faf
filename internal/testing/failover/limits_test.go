package failover

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/dbserver"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// A batch too large for the database's lock table, 10,000 events (a Kafka
// fetch) on a Daily-partitioned PostgreSQL table, whose claim takes a lock
// per event, on a server with max_locks_per_transaction 10: the database
// reports out of shared memory (53200), and the batch consumer splits the
// batch until its parts fit instead of failing it whole on every attempt.
// Every event is processed once.
func TestBatchSplitsAtLockLimit(t *testing.T) {
	srv := dbserver.StartPostgres(t, "max_locks_per_transaction=10")
	db, err := sql.Open("postgres", srv.DSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Daily})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, store.CreateSchema(ctx))

	var handled, calls int
	consumer, err := inbox.NewBatchConsumer(inbox.BatchConfig{Store: store, Consumer: "fetch"}, func(ctx context.Context, msgs []*message.Message) error {
		calls++
		handled += len(msgs)
		inbox.TxNotNeeded(ctx)
		return nil
	})
	require.NoError(t, err)
	msgs := make([]*message.Message, 10_000)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), nil)
		msgs[i].Metadata.Set(inbox.DefaultEventIDMetadataKey, testdb.UUIDv7(time.Now(), fmt.Sprint("fetch-", i)))
	}
	require.NoError(t, consumer.Process(ctx, msgs))
	require.Equal(t, len(msgs), handled)
	var rows int
	require.NoError(t, db.QueryRow("SELECT count(*) FROM watermill_inbox").Scan(&rows))
	require.Equal(t, len(msgs), rows)
	t.Logf("10,000 events in %d batches", calls)
}
