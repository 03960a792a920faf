package watermillsql_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
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
	pool := testPool(t)
	store, table, topic := pgxOutbox(t, pool)
	schema := wsql.DefaultPostgreSQLSchema{}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c"})
	require.NoError(t, err)
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

// On a native pgx store, a watermill-sql v4 ProducedPublisher built on the
// pool (wsql.BeginnerFromPgx) is refused before it writes; one built on the
// inbox transaction (wsql.TxFromPgx) writes the produced message once.
func TestProducedPublisherOnThePgxPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testPool(t)
	schema := wsql.DefaultPostgreSQLSchema{}
	for _, onTx := range []bool{true, false} {
		store, _, topic := pgxOutbox(t, pool)
		mw, err := inbox.NewMiddleware(inbox.Config{Store: store, ProducedPublisher: pgxinbox.PublishInTx(func(tx pgx.Tx) (message.Publisher, error) {
			if !onTx {
				return wsql.NewPublisher(wsql.BeginnerFromPgx(pool), wsql.PublisherConfig{SchemaAdapter: schema}, nil)
			}
			return wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: schema}, nil)
		})})
		require.NoError(t, err)
		results := twoAttempts(t, mw, topic, func(*message.Message) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{}`))}, nil
		})
		var rows int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema.MessagesTable(topic)).Scan(&rows))
		if onTx {
			require.NoError(t, results[0])
			require.Equal(t, 1, rows)
			continue
		}
		require.ErrorIs(t, results[0], inbox.ErrMiswired)
		require.ErrorContains(t, results[0], "writes through a *pgxpool.Pool, not the inbox transaction")
		require.Zero(t, rows)
	}
}

func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testdb.PostgresDSN())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// pgxOutbox creates, on pool, an inbox table with its native pgx store and
// a watermill-sql v4 outbox topic, dropped when the test ends.
func pgxOutbox(t *testing.T, pool *pgxpool.Pool) (store *pgxinbox.Store, table, topic string) {
	t.Helper()
	ctx := context.Background()
	table, topic = testdb.Name("inbox"), testdb.Name("out")
	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	schema := wsql.DefaultPostgreSQLSchema{}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		SchemaAdapter: schema, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{}, InitializeSchema: true,
	}, nil)
	require.NoError(t, err)
	require.NoError(t, sub.SubscribeInitialize(topic))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %s, %s, "watermill_offsets_%s"`, table, schema.MessagesTable(topic), topic))
	})
	return store, table, topic
}
