package docs_test

import (
	"context"
	"database/sql"
	"net/url"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
)

// schemaDSN creates a PostgreSQL schema of the test's own and returns a DSN
// whose connections work in it, so that a snippet's fixed table names
// (watermill_inbox, invoices) do not meet another test's.
func schemaDSN(t *testing.T) string {
	t.Helper()
	admin := testdb.Postgres(t, "pgx")
	schema := testdb.Name("docs")
	_, err := admin.Exec(`CREATE SCHEMA ` + schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(`DROP SCHEMA ` + schema + ` CASCADE`) })
	u, err := url.Parse(testdb.PostgresDSN())
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// pipeline is what a snippet's handler runs in: a router and an in-memory
// pub/sub, with a way to deliver one event several times.
type pipeline struct {
	router *message.Router
	pubSub *gochannel.GoChannel
}

func newPipeline(t *testing.T) pipeline {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubSub.Close() })
	return pipeline{router: router, pubSub: pubSub}
}

// deliver runs the router, publishes the event copies times on topic, and
// waits until count() reaches want.
func (p pipeline) deliver(t *testing.T, topic, eventID string, copies int, want int, count func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.router.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	<-p.router.Running()
	for range copies {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msg.Metadata.Set("event_id", eventID)
		require.NoError(t, p.pubSub.Publish(topic, msg))
	}
	require.Eventually(t, func() bool { return count() >= want }, 20*time.Second, 20*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // a late duplicate would show now
	require.Equal(t, want, count())
}

func countRows(t *testing.T, db *sql.DB, table string) func() int {
	return func() int {
		var n int
		require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM `+table).Scan(&n))
		return n
	}
}
