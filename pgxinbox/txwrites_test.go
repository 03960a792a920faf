package pgxinbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// outboxPublisher inserts each message's payload through the claim's
// transaction.
type outboxPublisher struct {
	tx    pgx.Tx
	table string
}

func (p outboxPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if _, err := p.tx.Exec(context.Background(), "INSERT INTO "+p.table+" (k) VALUES ($1)", string(m.Payload)); err != nil {
			return err
		}
	}
	return nil
}

func (outboxPublisher) Close() error { return nil }

// outcomeCounts counts the outcomes observed.
type outcomeCounts struct {
	mu  sync.Mutex
	got map[observe.Outcome]int
}

func (o *outcomeCounts) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(ob observe.Observation) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.got[ob.Outcome]++
	}
}

// A hardened PostgreSQL, SELECT on pg_stat_xact_user_tables revoked: the
// produced publisher's write count fails inside the claim's transaction,
// which goes on. Every message is processed at its first attempt, its
// produced rows committed with it; the check goes unchecked, said once.
func TestWriteCountWithoutPrivilegeIsProcessed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.RestrictedPostgres(t, "pg_stat_xact_user_tables"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{Table: testdb.Name("inbox")})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	outbox := testdb.Name("outbox")
	_, err = pool.Exec(ctx, "CREATE TABLE "+outbox+" (k text PRIMARY KEY)")
	require.NoError(t, err)

	logger := conformancetest.NewLogger()
	seen := &outcomeCounts{got: map[observe.Outcome]int{}}
	mw, err := inbox.NewMiddleware(inbox.Config{
		Store: store, Logger: logger, Observer: seen,
		ProducedPublisher: pgxinbox.PublishInTx(func(tx pgx.Tx) (message.Publisher, error) { return outboxPublisher{tx, outbox}, nil }),
	})
	require.NoError(t, err)
	ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	conformancetest.RunRouter(t, func(r *message.Router) {
		r.AddHandler("billing", "events", ps, "out", ps, inbox.Handler(mw, func(m *message.Message) ([]*message.Message, error) {
			id, _, _ := inbox.EventIDFromContext(m.Context())
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(id))}, nil
		}))
	})
	for _, id := range []string{"ev-0", "ev-1", "ev-2"} {
		conformancetest.PublishWithin(t, ps, "events", msg(id))
	}
	seen.mu.Lock()
	require.Equal(t, map[observe.Outcome]int{observe.Processed: 3}, seen.got, "no attempt fails")
	seen.mu.Unlock()
	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+outbox).Scan(&rows))
	require.Equal(t, 3, rows, "the produced messages commit with their claims")
	require.Empty(t, logger.Errors(), "a check that cannot run is not an error")
	logs := logger.Warnings()
	require.Len(t, logs, 1, "one line for the unchecked consumer")
	require.Equal(t, string(observe.Unchecked), logs[0].Fields["warning"])
	require.Contains(t, logs[0].Fields["reason"], "42501", "the reason says what failed")
}
