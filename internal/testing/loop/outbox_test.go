package loop_test

import (
	"context"
	stdsql "database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqlv3 "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// sqlTopic returns a unique watermill-sql topic whose table (watermill_<topic>)
// exists and is dropped when the test ends.
func sqlTopic(t testing.TB, db *stdsql.DB) string {
	t.Helper()
	topic := testdb.Name("invoices")
	t.Cleanup(func() {
		_, _ = db.Exec(`DROP TABLE IF EXISTS "watermill_` + topic + `", "watermill_offsets_` + topic + `"`)
	})
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		SchemaAdapter:  wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
	}, logger)
	require.NoError(t, err)
	require.NoError(t, sub.SubscribeInitialize(topic))
	require.NoError(t, sub.Close())
	return topic
}

// outboxRows returns the uuid of every row in a watermill-sql topic table.
func outboxRows(t testing.TB, db *stdsql.DB, topic string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT uuid FROM "watermill_` + topic + `" ORDER BY "offset"`)
	require.NoError(t, err)
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

// The messages a handler returns are written to the outbox in the inbox
// transaction (watermill-sql v4, sql.TxFromStdSQL): when anything fails after
// they were written, they roll back with the claim and the effect, and the
// redelivery writes them once; a duplicate writes nothing.
func TestProducedMessagesCommitWithTheEffect(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t, "pgx")
	billing := effects.NewService(t, db, "billing")
	invoices := sqlTopic(t, db)

	// The first attempt at each event writes its invoice event to the
	// outbox, then fails, as a crash before the commit would.
	var mu sync.Mutex
	attempts := map[string]int{}
	producedPublisher := func(tx *stdsql.Tx) (message.Publisher, error) {
		pub, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{
			SchemaAdapter: wsql.DefaultPostgreSQLSchema{},
			// AutoInitializeSchema must stay false: watermill-sql refuses it
			// on a transaction, where CREATE TABLE could commit implicitly.
		}, logger)
		if err != nil {
			return nil, err
		}
		return failFirstPublish{pub, &mu, attempts}, nil
	}

	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, logger)
	t.Cleanup(func() { _ = pubSub.Close() })
	var produced sync.Map // event id -> produced message uuid
	billing.Run(t, pubSub, "orders", effects.RunConfig{
		PublishTopic:      invoices,
		ProducedPublisher: producedPublisher,
		Produce: func(msg *message.Message) []*message.Message {
			invoice := message.NewMessage(watermill.NewUUID(), []byte(`{"invoice":true}`))
			invoice.Metadata.Set("order_event_id", msg.UUID)
			produced.Store(msg.UUID, invoice.UUID)
			return []*message.Message{invoice}
		},
	})

	const n = 10
	var ids []string
	for i := range n {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":%d}`, i))
		ids = append(ids, msg.UUID)
		require.NoError(t, pubSub.Publish("orders", msg))
		require.NoError(t, pubSub.Publish("orders", msg.Copy())) // a duplicate delivery
	}
	// Each event: a failed attempt, its redelivery and a duplicate.
	require.Eventually(t, func() bool { return billing.Delivered.Load() == 3*n && billing.Handled.Load() == n },
		waitFor, 10*time.Millisecond)

	billing.RequireExactlyOnce(t, ids)
	var want []string
	for _, id := range ids {
		invoice, ok := produced.Load(id)
		require.True(t, ok)
		want = append(want, invoice.(string))
	}
	got := outboxRows(t, db, invoices)
	require.Len(t, got, n, "one outbox row per event: failed attempts rolled theirs back, duplicates wrote none")
	require.Subset(t, got, want, "the outbox holds the messages of the attempts that committed")
}

// failFirstPublish writes the messages, then fails the first attempt of
// each event.
type failFirstPublish struct {
	message.Publisher
	mu       *sync.Mutex
	attempts map[string]int
}

func (p failFirstPublish) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	eventID := msgs[0].Metadata.Get("order_event_id")
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempts[eventID]++
	if p.attempts[eventID] == 1 {
		return errors.New("crash after writing to the outbox, before the commit")
	}
	return nil
}

// watermill-sql refuses AutoInitializeSchema on a transaction, in v3 and
// v4: create the outbox table beforehand (a relay's subscriber with
// InitializeSchema, or a migration), then publish in the transaction.
func TestOutboxPublisherInTransactionNeedsTablesUpFront(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t, "pgx")
	tx, err := db.Begin()
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()

	_, err = wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{
		SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true,
	}, logger)
	require.ErrorContains(t, err, "AutoInitializeSchema")
	_, err = wsqlv3.NewPublisher(tx, wsqlv3.PublisherConfig{
		SchemaAdapter: wsqlv3.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true,
	}, logger)
	require.ErrorContains(t, err, "AutoInitializeSchema")
}

// With watermill-sql v3 the publisher takes the *sql.Tx itself; with v4,
// wrap it: sql.NewPublisher(sql.TxFromStdSQL(tx), ...).
func Example_producedPublisherWatermillSQLv3() {
	ctx := context.Background()
	db, err := stdsql.Open("pgx", testdb.PostgresDSN())
	check(err)
	defer db.Close()
	inboxTable, invoices := testdb.Name("inbox"), testdb.Name("invoices")
	defer func() {
		_, _ = db.Exec(`DROP TABLE IF EXISTS ` + inboxTable + `, ` + inboxTable + `_leases, "watermill_` + invoices + `", "watermill_offsets_` + invoices + `"`)
	}()
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: inboxTable})
	check(err)
	check(store.CreateSchema(ctx))
	// The outbox table must exist before a transaction publishes to it.
	relaySub, err := wsqlv3.NewSubscriber(db, wsqlv3.SubscriberConfig{
		SchemaAdapter:  wsqlv3.DefaultPostgreSQLSchema{},
		OffsetsAdapter: wsqlv3.DefaultPostgreSQLOffsetsAdapter{},
	}, nil)
	check(err)
	check(relaySub.SubscribeInitialize(invoices))

	mw, err := inbox.NewMiddleware(inbox.Config{
		Store: store,
		ProducedPublisher: inbox.PublishInTx(func(tx *stdsql.Tx) (message.Publisher, error) {
			return wsqlv3.NewPublisher(tx, wsqlv3.PublisherConfig{SchemaAdapter: wsqlv3.DefaultPostgreSQLSchema{}}, nil)
		}),
	})
	check(err)
	check(effects.InvoiceTwice(ctx, mw, invoices)) // one order, delivered twice

	var rows int
	check(db.QueryRow(`SELECT count(*) FROM "watermill_` + invoices + `"`).Scan(&rows))
	fmt.Println("outbox rows:", rows)
	// Output: outbox rows: 1
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
