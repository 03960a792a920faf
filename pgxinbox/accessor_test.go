package pgxinbox_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The accessor of the other store returns no transaction, and says so once
// per consumer at error level, naming the one that fits; the handler that
// then succeeds without a transaction is reported as well.
func TestWrongAccessorIsLogged(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t, "pgx")
	for _, tc := range []struct {
		name  string
		store func(sc sqlinbox.Config) inboxdriver.Store
		take  func(ctx context.Context) bool
		want  string
	}{
		{
			name:  "inbox.TxFromContext behind pgxinbox",
			store: func(sc sqlinbox.Config) inboxdriver.Store { return newStore(t, sc) },
			take: func(ctx context.Context) bool {
				_, ok := inbox.TxFromContext(ctx)
				return ok
			},
			want: "Inbox: warning: inbox.TxFromContext returned no transaction: *pgxinbox.Store hands out another kind; take it with pgxinbox.TxFromContext(msg.Context())",
		},
		{
			name: "pgxinbox.TxFromContext behind sqlinbox",
			store: func(sc sqlinbox.Config) inboxdriver.Store {
				s, err := sqlinbox.New(db, sc)
				require.NoError(t, err)
				return s
			},
			take: func(ctx context.Context) bool {
				_, ok := pgxinbox.TxFromContext(ctx)
				return ok
			},
			want: "Inbox: warning: pgxinbox.TxFromContext returned no transaction: *sqlinbox.Store hands out another kind; take it with inbox.TxFromContext(msg.Context())",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc := sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: testdb.Table(t, db, "inbox")}
			store := tc.store(sc)
			require.NoError(t, store.(interface{ CreateSchema(context.Context) error }).CreateSchema(context.Background()))
			logger := watermill.NewCaptureLogger()
			mws := map[string]message.HandlerMiddleware{}
			for _, consumer := range []string{"a", "b"} {
				mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: consumer, Logger: logger})
				require.NoError(t, err)
				mws[consumer] = mw
			}
			for _, consumer := range []string{"a", "a", "a", "b"} {
				_, err := mws[consumer](func(msg *message.Message) ([]*message.Message, error) {
					require.False(t, tc.take(msg.Context()), "the wrong accessor returned a transaction")
					return nil, nil
				})(message.NewMessage(watermill.NewUUID(), nil))
				require.NoError(t, err)
			}
			var wrong, unused []string
			require.Empty(t, logger.Captured()[watermill.ErrorLogLevel], "a suspicion is not an error")
			for _, l := range logger.Captured()[watermill.InfoLogLevel] {
				if l.Fields["warning"] == nil {
					continue
				}
				if l.Msg == tc.want+"; logged once per consumer" {
					wrong = append(wrong, l.Fields["consumer"].(string))
				} else {
					require.Contains(t, l.Msg, "succeeded without taking the inbox transaction")
					unused = append(unused, l.Fields["consumer"].(string))
				}
			}
			require.Equal(t, []string{"a", "b"}, wrong, "one line per consumer naming the right accessor")
			require.Equal(t, []string{"a", "b"}, unused, "the wrong accessor does not count as taking the transaction")
		})
	}
}
