// Package effects runs consumers whose handler has a non-idempotent effect
// (one row per handled message in a table without a unique key, so a doubled
// effect shows up as a second row) behind the inbox middleware, on
// PostgreSQL or MariaDB, and counts effects from the database. The end-to-end tests of
// every broker share it.
package effects

import (
	"context"
	stdsql "database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// WaitFor bounds every wait of the package.
const WaitFor = 30 * time.Second

// PublishEvents publishes n new events to topic and returns their ids
// (msg.UUID): UUIDv7s, which every inbox layout takes, tables partitioned by
// the time inside event ids included.
func PublishEvents(t testing.TB, pub message.Publisher, topic string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		msg := message.NewMessage(uuid.Must(uuid.NewV7()).String(), fmt.Appendf(nil, `{"n":%d}`, i))
		ids[i] = msg.UUID
		require.NoError(t, pub.Publish(topic, msg))
	}
	return ids
}

// Service is a consumer with its own inbox and effect tables.
type Service struct {
	Name    string // handler name, hence inbox consumer
	DB      *stdsql.DB
	Store   *sqlinbox.Store
	Config  sqlinbox.Config // the store's
	Inbox   string          // inbox table
	Effects string          // effect table

	Delivered atomic.Int64 // messages that reached the inbox
	Handled   atomic.Int64 // handler calls that committed

	mu       sync.Mutex
	outcomes map[observe.Outcome]int64
}

// NewService creates a service with its own inbox and effect tables.
func NewService(t testing.TB, db *stdsql.DB, name string) *Service {
	t.Helper()
	return NewServiceWith(t, db, name, sqlinbox.Config{})
}

// NewServiceWith is NewService with a store configuration; its Table is
// the service's, and its Dialect defaults to PostgreSQL (sqlinbox.MySQL
// for MariaDB).
func NewServiceWith(t testing.TB, db *stdsql.DB, name string, config sqlinbox.Config) *Service {
	t.Helper()
	s := openService(t, db, name, testdb.Table(t, db, "inbox"), testdb.Table(t, db, "effects"), config)
	require.NoError(t, s.Store.CreateSchema(context.Background()))
	ddl := `CREATE TABLE ` + s.Effects + ` (id bigserial PRIMARY KEY, event_id text NOT NULL)`
	if s.mysql() {
		ddl = `CREATE TABLE ` + s.Effects + ` (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(64) NOT NULL)`
	}
	_, err := db.Exec(ddl)
	require.NoError(t, err)
	return s
}

func (s *Service) mysql() bool { return s.Config.Dialect == sqlinbox.MySQL }

// OpenService uses tables another process created with config.
func OpenService(t testing.TB, db *stdsql.DB, name, inboxTable, effects string, config sqlinbox.Config) *Service {
	t.Helper()
	return openService(t, db, name, inboxTable, effects, config)
}

func openService(t testing.TB, db *stdsql.DB, name, inboxTable, effects string, config sqlinbox.Config) *Service {
	t.Helper()
	if config.Dialect == nil {
		config.Dialect = sqlinbox.PostgreSQL
	}
	config.Table = inboxTable
	store, err := sqlinbox.New(db, config)
	require.NoError(t, err)
	return &Service{Name: name, DB: db, Store: store, Config: config, Inbox: inboxTable, Effects: effects, outcomes: map[observe.Outcome]int64{}}
}

// RunConfig adds behaviour around a service's handler.
type RunConfig struct {
	// Outer wraps the inbox: it sees every delivery, and what it does after
	// the inner handler returns happens after the commit.
	Outer message.HandlerMiddleware
	// Produce makes the handler return follow-up events, published to
	// PublishTopic through ProducedPublisher inside the transaction.
	Produce           func(msg *message.Message) []*message.Message
	PublishTopic      string
	ProducedPublisher func(tx *stdsql.Tx) (message.Publisher, error)
	// AfterEffect runs in the handler after the effect is written.
	AfterEffect func(msg *message.Message) error
	// EffectKey is what the effect row records. Defaults to the event id.
	EffectKey func(msg *message.Message) string
	// Logger is the router's. Defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// Inbox adjusts the middleware's configuration.
	Inbox func(*inbox.Config)
}

// Run consumes topic with sub until the returned stop function is called
// (also at the end of the test).
func (s *Service) Run(t testing.TB, sub message.Subscriber, topic string, rc RunConfig) (stop func()) {
	t.Helper()
	logger := rc.Logger
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	config := inbox.Config{Store: s.Store, Observer: s}
	if pp := rc.ProducedPublisher; pp != nil {
		config.ProducedPublisher = inbox.PublishInTx(pp)
	}
	if rc.Inbox != nil {
		rc.Inbox(&config)
	}
	mw, err := inbox.NewMiddleware(config)
	require.NoError(t, err)

	h := router.AddHandler(s.Name, topic, sub, rc.PublishTopic, DiscardPublisher{}, s.handle(rc))
	var mws []message.HandlerMiddleware
	mws = append(mws, func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			s.Delivered.Add(1)
			return h(msg)
		}
	})
	if rc.Outer != nil {
		mws = append(mws, rc.Outer)
	}
	mws = append(mws, mw)
	h.AddMiddleware(mws...)

	return StartRouter(t, router)
}

// StartRouter runs router until the returned stop function is called (also
// at the end of the test).
func StartRouter(t testing.TB, router *message.Router) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("router stopped at start: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			require.NoError(t, router.Close())
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return stop
}

// Handler is the service's handler, for a router a test wires itself: it
// writes the effect through the inbox transaction.
func (s *Service) Handler(rc RunConfig) message.HandlerFunc { return s.handle(rc) }

func (s *Service) handle(rc RunConfig) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, ok := inbox.TxFromContext(ctx)
		if !ok {
			return nil, errors.New("no inbox transaction")
		}
		key, _, _ := inbox.EventIDFromContext(ctx)
		if rc.EffectKey != nil {
			key = rc.EffectKey(msg)
		}
		insert := `INSERT INTO ` + s.Effects + ` (event_id) VALUES ($1)`
		if s.mysql() {
			insert = `INSERT INTO ` + s.Effects + ` (event_id) VALUES (?)`
		}
		if _, err := tx.ExecContext(ctx, insert, key); err != nil {
			return nil, fmt.Errorf("writing the effect: %w", err)
		}
		if rc.AfterEffect != nil {
			if err := rc.AfterEffect(msg); err != nil {
				return nil, err
			}
		}
		var out []*message.Message
		if rc.Produce != nil {
			out = rc.Produce(msg)
		}
		// Counted once the commit happened, not before.
		if err := inbox.AfterCommit(ctx, func(context.Context) error { s.Handled.Add(1); return nil }); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// Start implements observe.Observer: the service counts the outcome of every
// message.
func (s *Service) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(o observe.Observation) {
		s.mu.Lock()
		s.outcomes[o.Outcome]++
		s.mu.Unlock()
	}
}

// Outcomes returns how many messages ended in each outcome so far.
func (s *Service) Outcomes() map[observe.Outcome]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[observe.Outcome]int64, len(s.outcomes))
	for o, n := range s.outcomes {
		out[o] = n
	}
	return out
}

// Settled waits until every delivery that reached the inbox has ended
// there with an outcome: Delivered counts a message before the inbox has
// decided it, so a copy waiting for its sibling's claim can still be on
// its way to "duplicate" once the other counters look final.
func (s *Service) Settled(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool {
		var ended int64
		for _, n := range s.Outcomes() {
			ended += n
		}
		return ended == s.Delivered.Load()
	}, WaitFor, 20*time.Millisecond, "deliveries still inside the inbox")
}

// EffectCounts returns how many effect rows each event id has.
func (s *Service) EffectCounts(t testing.TB) map[string]int {
	t.Helper()
	return CountByID(t, s.DB, `SELECT event_id, count(*) FROM `+s.Effects+` GROUP BY event_id`)
}

// CountByID runs query, which returns (id, count) rows, and returns the
// counts by id.
func CountByID(t testing.TB, db *stdsql.DB, query string, args ...any) map[string]int {
	t.Helper()
	rows, err := db.Query(query, args...)
	require.NoError(t, err)
	defer rows.Close()
	counts := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		counts[id] = n
	}
	require.NoError(t, rows.Err())
	return counts
}

// RequireExactlyOnce asserts that every id has exactly one effect row and
// that no other effect exists.
func (s *Service) RequireExactlyOnce(t testing.TB, ids []string) {
	t.Helper()
	want := make(map[string]int, len(ids))
	for _, id := range ids {
		want[id] = 1
	}
	require.Equal(t, want, s.EffectCounts(t), "%s: effects per event id", s.Name)
}

// EffectRows is the number of effect rows.
func (s *Service) EffectRows(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, s.DB.QueryRow(`SELECT count(*) FROM `+s.Effects).Scan(&n))
	return n
}

// WaitEffects waits until the service has written n effect rows.
func (s *Service) WaitEffects(t testing.TB, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return s.EffectRows(t) >= n }, WaitFor, 20*time.Millisecond,
		"%s wrote %d effects, want %d", s.Name, s.EffectRows(t), n)
}

// DiscardPublisher stands for the router's publisher when the inbox
// publishes produced messages itself: the router must never get any.
type DiscardPublisher struct{}

// Publish fails if the router has anything to publish.
func (DiscardPublisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) > 0 {
		return fmt.Errorf("router asked to publish %d messages to %s after the commit", len(msgs), topic)
	}
	return nil
}

// Close does nothing.
func (DiscardPublisher) Close() error { return nil }

// InvoiceTwice runs a router with one handler behind mw that returns one
// invoice message, to the topic invoices, per order, delivers one order
// twice, and returns once both deliveries are through: the examples'
// stand-in for a service whose produced messages go to an outbox.
func InvoiceTwice(ctx context.Context, mw message.HandlerMiddleware, invoices string) error {
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		return err
	}
	done := make(chan struct{}, 2)
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			defer func() { done <- struct{}{} }()
			return h(msg)
		}
	}, mw)
	orders := gochannel.NewGoChannel(gochannel.Config{}, nil)
	router.AddHandler("billing", "orders", orders, invoices, DiscardPublisher{},
		func(msg *message.Message) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{"invoice":1}`))}, nil
		})
	ran := make(chan error, 1)
	go func() { ran <- router.Run(ctx) }()
	<-router.Running()
	order := message.NewMessage(watermill.NewUUID(), []byte(`{"order":1}`))
	if err := orders.Publish("orders", order, order.Copy()); err != nil {
		return err
	}
	<-done
	<-done
	return errors.Join(router.Close(), <-ran)
}

// NackAfterCommit returns a middleware for outside the inbox that fails the
// first delivery of every n-th message after the inbox committed it, as a
// consumer dying before its ack would: the broker redelivers a message whose
// effect is already committed. The counter is the number of such nacks.
func NackAfterCommit(n int64) (message.HandlerMiddleware, *atomic.Int64) {
	var (
		mu      sync.Mutex
		seen    = map[string]bool{}
		handled int64
		crashes atomic.Int64
	)
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				return out, err
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[msg.UUID] {
				return out, nil
			}
			seen[msg.UUID] = true
			if handled++; handled%n == 0 {
				crashes.Add(1)
				return nil, errors.New("consumer crashed after its commit, before the ack")
			}
			return out, nil
		}
	}, &crashes
}
