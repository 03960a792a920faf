package watermillsql_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The handler writes its follow-up event to a watermill-sql v4 outbox in
// the native pgx inbox transaction: the event commits with the claim, or
// not at all.
func TestOutboxThroughTxFromPgx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.PostgresDSN())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table := testdb.Name("inbox")
	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c"})
	require.NoError(t, err)

	topic := testdb.Name("out")
	schema := wsql.DefaultPostgreSQLSchema{}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		SchemaAdapter: schema, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{}, InitializeSchema: true,
	}, nil)
	require.NoError(t, err)
	require.NoError(t, sub.SubscribeInitialize(topic))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %s, "watermill_offsets_%s"`, schema.MessagesTable(topic), topic))
	})
	count := func(query string, args ...any) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, query, args...).Scan(&n))
		return n
	}

	attempt := 0
	h := func(m *message.Message) ([]*message.Message, error) {
		attempt++
		tx, _ := pgxinbox.TxFromContext(m.Context())
		pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: schema}, nil)
		if err != nil {
			return nil, err
		}
		if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(`{}`))); err != nil {
			return nil, err
		}
		if attempt == 1 {
			return nil, errors.New("fail after publishing")
		}
		return nil, nil
	}
	for range 3 {
		m := message.NewMessage(watermill.NewUUID(), nil)
		m.Metadata.Set(inbox.DefaultEventIDMetadataKey, "order-1")
		_, _ = mw(h)(m)
	}
	require.Equal(t, 2, attempt, "the third delivery is a duplicate")
	require.Equal(t, 1, count("SELECT count(*) FROM "+schema.MessagesTable(topic)))
	require.Equal(t, 1, count("SELECT count(*) FROM "+table+" WHERE event_id = $1", "order-1"))
}
