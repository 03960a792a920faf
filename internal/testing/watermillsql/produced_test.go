package watermillsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/internal/testing/wsqltest"
)

// failingCommit publishes through its publisher, then makes the inbox
// transaction's COMMIT fail, once: on PostgreSQL with a row that breaks a
// deferred foreign key, on MariaDB (which has none) by killing the
// transaction's connection.
type failingCommit struct {
	message.Publisher
	fail func() error
}

func (f failingCommit) Publish(topic string, msgs ...*message.Message) error {
	if err := f.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	return f.fail()
}

// commitFailer returns what makes the first COMMIT of tx fail.
func commitFailer(t *testing.T, r *wsqltest.Rig) func(ctx context.Context, tx *sql.Tx) error {
	if r.MySQL {
		return func(ctx context.Context, tx *sql.Tx) error {
			var id int64
			if err := tx.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
				return err
			}
			_, err := r.DB.Exec(fmt.Sprintf(`KILL CONNECTION %d`, id))
			return err
		}
	}
	parent, child := testdb.Table(t, r.DB, "parent"), testdb.Table(t, r.DB, "child")
	for _, stmt := range []string{
		`CREATE TABLE ` + parent + ` (id INT PRIMARY KEY)`,
		`CREATE TABLE ` + child + ` (parent_id INT NOT NULL REFERENCES ` + parent + ` (id) DEFERRABLE INITIALLY DEFERRED)`,
	} {
		_, err := r.DB.Exec(stmt)
		require.NoError(t, err)
	}
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO `+child+` (parent_id) VALUES (1)`)
		return err
	}
}

// The handler returns three messages; ProducedPublisher writes them to a
// watermill-sql outbox; the first COMMIT fails after they were written,
// and the redelivery is processed again. Built on the transaction, the
// outbox holds them once. Built on the *sql.DB, its rows would commit on
// their own, and the redelivery write them again (6 rows for 3 messages):
// a watermill-sql publisher there is proof of it, even wrapped, and is
// refused before it writes anything, on every delivery, and nothing of the
// message commits.
func TestProducedPublisherOnTheDatabase(t *testing.T) {
	t.Parallel()
	for _, onTx := range []bool{true, false} {
		t.Run(map[bool]string{true: "on the transaction", false: "on the database"}[onTx], func(t *testing.T) {
			t.Parallel()
			wsqltest.EachFlavour(t, func(t *testing.T, r *wsqltest.Rig) {
				failCommit := commitFailer(t, r)
				var once sync.Once
				mw, err := inbox.NewMiddleware(inbox.Config{
					Store: r.Store(t),
					ProducedPublisher: inbox.PublishInTx(func(tx *sql.Tx) (message.Publisher, error) {
						ctx := context.Background()
						pub := r.Publisher(t)
						if onTx {
							var err error
							if pub, err = r.TxPublisher(tx); err != nil {
								return nil, err
							}
						}
						return failingCommit{Publisher: pub, fail: func() (err error) {
							once.Do(func() { err = failCommit(ctx, tx) })
							return err
						}}, nil
					}),
				})
				require.NoError(t, err)
				results := twoAttempts(t, mw, r.Topic, func(msg *message.Message) ([]*message.Message, error) {
					tx, _ := inbox.TxFromContext(msg.Context())
					if err := r.Count(msg.Context(), tx, msg.UUID); err != nil {
						return nil, err
					}
					var out []*message.Message
					for range 3 {
						out = append(out, message.NewMessage(watermill.NewUUID(), []byte(`{}`)))
					}
					return out, nil
				})
				if onTx {
					require.Error(t, results[0], "the first commit fails")
					require.NotErrorIs(t, results[0], inbox.ErrMiswired)
					require.NoError(t, results[1])
					require.Equal(t, 3, r.Rows(t), "each produced message once")
					require.Equal(t, wsqltest.Exactly(1), r.Outcome(t))
					return
				}
				for _, err := range results {
					require.ErrorIs(t, err, inbox.ErrMiswired)
					require.ErrorContains(t, err, "writes through a *sql.DB, not the inbox transaction")
				}
				require.Zero(t, r.Rows(t), "refused before it wrote anything")
				require.Equal(t, wsqltest.Exactly(0), r.Outcome(t))
			})
		})
	}
}

// twoAttempts delivers one message to a handler that publishes to topic,
// behind mw, and returns mw's result for its first two attempts: the first
// failed one is nacked and redelivered, the second acked whatever its
// result.
func twoAttempts(t *testing.T, mw message.HandlerMiddleware, topic string, h message.HandlerFunc) []error {
	t.Helper()
	ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	var (
		mu      sync.Mutex
		results []error
	)
	conformancetest.RunRouter(t, func(router *message.Router) {
		router.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := next(msg)
				mu.Lock()
				defer mu.Unlock()
				results = append(results, err)
				if err != nil && len(results) == 1 {
					return nil, err
				}
				return out, nil
			}
		}, mw)
		router.AddHandler("billing", "orders", ps, topic, effects.DiscardPublisher{}, h)
	})
	conformancetest.PublishWithin(t, ps, "orders", message.NewMessage(watermill.NewUUID(), []byte(`{}`)))
	mu.Lock()
	defer mu.Unlock()
	if len(results) == 1 {
		results = append(results, errors.New("no second attempt: the first succeeded"))
	}
	return results
}
