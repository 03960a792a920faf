package sqlinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Correct services the guards once stopped, as users built them: each
// processes every message once; where its setup is suspicious rather than
// wrong, it gets one warning.

// execPublisher publishes each message by running query through tx with the
// message's payload.
type execPublisher struct {
	tx    *sql.Tx
	query string
	repo  *repo // what an application's publisher often holds beside
}

type repo struct{ db *sql.DB }

func (p execPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if _, err := p.tx.Exec(p.query, string(m.Payload)); err != nil {
			return err
		}
	}
	return nil
}

func (execPublisher) Close() error { return nil }

// producing runs three events through a router whose handler writes its
// effect and produces one message, published by pub, and returns the
// effects, the error log and the warnings seen.
func producing(t *testing.T, db *sql.DB, dialect sqlinbox.Dialect, pub func(tx *sql.Tx) message.Publisher) (map[string]int, []watermill.CapturedMessage, *warnings) {
	t.Helper()
	store, effects := poolStore(t, db, dialect)
	logger := conformancetest.NewLogger()
	seen := &warnings{}
	mw, err := inbox.NewMiddleware(inbox.Config{
		Store: store, Logger: logger, Observer: seen,
		ProducedPublisher: inbox.PublishInTx(func(tx *sql.Tx) (message.Publisher, error) { return pub(tx), nil }),
	})
	require.NoError(t, err)
	ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	conformancetest.RunRouter(t, func(r *message.Router) {
		r.AddHandler("billing", "events", ps, "out", ps, inbox.Handler(mw, func(msg *message.Message) ([]*message.Message, error) {
			id, _, _ := inbox.EventIDFromContext(msg.Context())
			if err := effects.write(msg.Context(), id); err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(id))}, nil
		}))
	})
	for i := range 3 {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, fmt.Sprintf("ev-%d", i))
		conformancetest.PublishWithin(t, ps, "events", msg)
	}
	return effects.count(t), logger.Warnings(), seen
}

// An outbox that deduplicates (INSERT ... ON CONFLICT DO NOTHING through
// the inbox transaction) whose publishes hit existing keys, and a
// publisher that holds the application's repository but writes through
// the transaction: all processed; the first, which writes no row, warned
// about once.
func TestCorrectPublishersAreProcessed(t *testing.T) {
	t.Parallel()
	for _, target := range []struct {
		name    string
		dialect sqlinbox.Dialect
		open    func(t testing.TB) *sql.DB
	}{
		{"PostgreSQL", sqlinbox.PostgreSQL, func(t testing.TB) *sql.DB { return testdb.Postgres(t, "postgres") }},
		{"SQLite", sqlinbox.SQLite, testdb.SQLite},
	} {
		t.Run(target.name, func(t *testing.T) {
			t.Parallel()
			db := target.open(t)
			outbox := testdb.Table(t, db, "outbox")
			_, err := db.Exec("CREATE TABLE " + outbox + " (k VARCHAR(64) PRIMARY KEY)")
			require.NoError(t, err)
			for i := range 3 {
				_, err := db.Exec(fmt.Sprintf("INSERT INTO %s (k) VALUES ('ev-%d')", outbox, i))
				require.NoError(t, err)
			}
			ph := "?"
			if target.dialect == sqlinbox.PostgreSQL {
				ph = "$1"
			}
			dedup := "INSERT INTO " + outbox + " (k) VALUES (" + ph + ") ON CONFLICT DO NOTHING"
			effects, logs, seen := producing(t, db, target.dialect, func(tx *sql.Tx) message.Publisher {
				return execPublisher{tx: tx, query: dedup}
			})
			require.Equal(t, map[string]int{"ev-0": 1, "ev-1": 1, "ev-2": 1}, effects)
			require.Len(t, logs, 1, "one warning")
			require.Equal(t, string(observe.PublisherOutsideTx), logs[0].Fields["warning"])
			require.Equal(t, 1, seen.count(observe.PublisherOutsideTx))

			fresh := testdb.Table(t, db, "outbox")
			_, err = db.Exec("CREATE TABLE " + fresh + " (k VARCHAR(64) PRIMARY KEY)")
			require.NoError(t, err)
			effects, logs, _ = producing(t, db, target.dialect, func(tx *sql.Tx) message.Publisher {
				return execPublisher{tx: tx, query: "INSERT INTO " + fresh + " (k) VALUES (" + ph + ")", repo: &repo{db: db}}
			})
			require.Equal(t, map[string]int{"ev-0": 1, "ev-1": 1, "ev-2": 1}, effects)
			require.Empty(t, logs, "a publisher holding the *sql.DB but writing through the transaction is fine")
		})
	}
}

// A CDC outbox: pg_notify and pg_logical_emit_message through the inbox
// transaction write no row. Processed, warned about once.
func TestNotifyingPublisherIsProcessed(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t, "postgres")
	for _, query := range []string{`SELECT pg_notify('orders', $1)`, `SELECT pg_logical_emit_message(true, 'orders', $1)`} {
		effects, logs, _ := producing(t, db, sqlinbox.PostgreSQL, func(tx *sql.Tx) message.Publisher {
			return execPublisher{tx: tx, query: query}
		})
		require.Equal(t, map[string]int{"ev-0": 1, "ev-1": 1, "ev-2": 1}, effects, query)
		require.Len(t, logs, 1, query)
	}
}

// The schema created by a migration role, and the application's role
// granted the inbox table only: the lease table is unreadable, so the
// shared-consumer check goes unchecked, said once, and every message is
// processed.
func TestInboxTableOnlyGrantIsProcessed(t *testing.T) {
	t.Parallel()
	admin := testdb.Postgres(t, "postgres")
	store, effects := poolStore(t, admin, sqlinbox.PostgreSQL)
	role := testdb.Name("app")
	for _, stmt := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + store.Table() + ", " + effects.table + " TO " + role,
		"GRANT USAGE ON SCHEMA public TO " + role,
	} {
		_, err := admin.Exec(stmt)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec("REVOKE ALL ON " + store.Table() + ", " + effects.table + " FROM " + role)
		_, _ = admin.Exec("REVOKE ALL ON SCHEMA public FROM " + role)
		_, _ = admin.Exec("DROP ROLE IF EXISTS " + role)
	})
	u, err := url.Parse(testdb.PostgresDSN())
	require.NoError(t, err)
	u.User = url.User(role)
	app := testdb.Open(t, "postgres", u.String())
	appStore, err := sqlinbox.New(app, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: store.Table()})
	require.NoError(t, err)
	logger := conformancetest.NewLogger()
	mw, err := inbox.NewMiddleware(inbox.Config{Store: appStore, Consumer: "billing", Logger: logger})
	require.NoError(t, err)
	for i := range 3 {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, fmt.Sprintf("ev-%d", i))
		_, err := mw(func(msg *message.Message) ([]*message.Message, error) {
			return nil, effects.write(msg.Context(), fmt.Sprintf("ev-%d", i))
		})(msg)
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, map[string]int{"ev-0": 1, "ev-1": 1, "ev-2": 1}, effects.count(t))
	logs := logger.Warnings()
	require.Len(t, logs, 1)
	require.Equal(t, string(observe.Unchecked), logs[0].Fields["warning"])
	reason := logs[0].Fields["reason"].(string)
	require.True(t, strings.Contains(reason, "42501") || strings.Contains(reason, "permission denied"), reason)
}

// warnings counts the warnings and the outcomes observed.
type warnings struct {
	mu       sync.Mutex
	got      map[observe.Warning]int
	outcomes map[observe.Outcome]int
}

func (w *warnings) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(ob observe.Observation) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.outcomes == nil {
			w.outcomes = map[observe.Outcome]int{}
		}
		w.outcomes[ob.Outcome]++
		if ob.Warning == "" {
			return
		}
		if w.got == nil {
			w.got = map[observe.Warning]int{}
		}
		w.got[ob.Warning]++
	}
}

func (w *warnings) count(k observe.Warning) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.got[k]
}

// A hardened PostgreSQL, SELECT on pg_stat_xact_user_tables revoked: the
// produced publisher's write count fails inside the claim's transaction,
// which must go on (a savepoint takes the failure). Every message is
// processed once; the check goes unchecked, said once.
func TestWriteCountWithoutPrivilegeIsProcessed(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"postgres", "pgx"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testdb.Open(t, driver, testdb.RestrictedPostgres(t, "pg_stat_xact_user_tables"))
			outbox := testdb.Table(t, db, "outbox")
			_, err := db.Exec("CREATE TABLE " + outbox + " (k VARCHAR(64) PRIMARY KEY)")
			require.NoError(t, err)
			effects, logs, seen := producing(t, db, sqlinbox.PostgreSQL, func(tx *sql.Tx) message.Publisher {
				return execPublisher{tx: tx, query: "INSERT INTO " + outbox + " (k) VALUES ($1)"}
			})
			require.Equal(t, map[string]int{"ev-0": 1, "ev-1": 1, "ev-2": 1}, effects)
			require.Len(t, logs, 1, "one line for the unchecked consumer")
			require.Equal(t, string(observe.Unchecked), logs[0].Fields["warning"])
			require.Contains(t, logs[0].Fields["reason"], "42501", "the reason says what failed")
			require.Zero(t, seen.count(observe.PublisherOutsideTx))
			require.Equal(t, map[observe.Outcome]int{observe.Processed: 3}, seen.outcomeCounts(), "no attempt fails")
			var rows int
			require.NoError(t, db.QueryRow("SELECT count(*) FROM "+outbox).Scan(&rows))
			require.Equal(t, 3, rows, "the produced messages commit with their claims")
		})
	}
}

func (w *warnings) outcomeCounts() map[observe.Outcome]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.outcomes)
}
