// Package wsqltest hands tests a watermill-sql topic (v3 or v4, on
// PostgreSQL or MariaDB) with the tables of Watermill's
// exactly-once-delivery-counter example: a counter and an effect log for a
// consumer to write, and an inbox table.
package wsqltest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqlv3 "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// WaitFor bounds every wait on a subscriber; it is never reached when the
// code works.
const WaitFor = 30 * time.Second

// Flavour is one watermill-sql setup: major version and database.
type Flavour struct {
	Version int  // 3 or 4
	MySQL   bool // MariaDB, else PostgreSQL
}

// Flavours are the setups watermill-sql offers: v3 and v4, each on
// PostgreSQL and MySQL.
var Flavours = []Flavour{{3, false}, {4, false}, {3, true}, {4, true}}

// EachFlavour runs test once per flavour, in parallel subtests, each with
// a rig of its own.
func EachFlavour(t *testing.T, test func(t *testing.T, r *Rig)) {
	for _, f := range Flavours {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			test(t, New(t, f))
		})
	}
}

func (f Flavour) String() string {
	if f.MySQL {
		return fmt.Sprintf("v%d-mariadb", f.Version)
	}
	return fmt.Sprintf("v%d-postgresql", f.Version)
}

func (f Flavour) dsn() string {
	if f.MySQL {
		return testdb.MySQLDSN()
	}
	return testdb.PostgresDSN()
}

func (f Flavour) open(t testing.TB, dsn string) *sql.DB {
	if f.MySQL {
		return testdb.Open(t, "mysql", dsn)
	}
	return testdb.Open(t, "pgx", dsn)
}

// Dialect is the inbox store's dialect for the flavour's database.
func (f Flavour) Dialect() sqlinbox.Dialect {
	if f.MySQL {
		return sqlinbox.MySQL
	}
	return sqlinbox.PostgreSQL
}

// Rebind turns ? placeholders into PostgreSQL's $n.
func (f Flavour) Rebind(query string) string {
	if f.MySQL {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Rig is a watermill-sql topic on one database, with a counter (one row,
// id 1) and an effect log for a consumer to write, and an inbox table. Its
// exported fields travel to a child process as JSON.
type Rig struct {
	Flavour
	DSN     string
	Topic   string
	Inbox   string
	Counter string
	Effects string

	DB *sql.DB `json:"-"`
}

// New creates the tables and drops them when the test ends.
func New(t testing.TB, f Flavour) *Rig {
	t.Helper()
	r := &Rig{Flavour: f, DSN: f.dsn(), Topic: testdb.Name("topic")}
	r.DB = f.open(t, r.DSN)
	r.Inbox = testdb.Table(t, r.DB, "inbox")
	r.Counter = testdb.Table(t, r.DB, "counter")
	r.Effects = testdb.Table(t, r.DB, "effects")
	for _, stmt := range []string{
		`CREATE TABLE ` + r.Counter + ` (id INT PRIMARY KEY, value INT NOT NULL)`,
		`INSERT INTO ` + r.Counter + ` VALUES (1, 0)`,
		`CREATE TABLE ` + r.Effects + ` (event_id VARCHAR(64) NOT NULL)`,
	} {
		_, err := r.DB.Exec(stmt)
		require.NoError(t, err)
	}
	require.NoError(t, r.Store(t).CreateSchema(context.Background()))
	sub, err := r.SubscriberWith(time.Second)
	require.NoError(t, err)
	require.NoError(t, sub.(interface{ SubscribeInitialize(string) error }).SubscribeInitialize(r.Topic))
	require.NoError(t, sub.Close())
	t.Cleanup(func() {
		for _, table := range []string{r.MessagesTable(), r.offsetsTable()} {
			_, _ = r.DB.Exec("DROP TABLE IF EXISTS " + table)
		}
	})
	return r
}

// Attach opens the rig's database again, in a child process that got the
// rig as JSON.
func (r *Rig) Attach(t testing.TB) {
	r.DB = r.open(t, r.DSN)
}

// Store is a sqlinbox store on the rig's inbox table.
func (r *Rig) Store(t testing.TB) *sqlinbox.Store {
	store, err := sqlinbox.New(r.DB, sqlinbox.Config{Dialect: r.Dialect(), Table: r.Inbox})
	require.NoError(t, err)
	return store
}

// MessagesTable is the topic's table, quoted.
func (r *Rig) MessagesTable() string {
	if r.MySQL {
		return wsql.DefaultMySQLSchema{}.MessagesTable(r.Topic)
	}
	return wsql.DefaultPostgreSQLSchema{}.MessagesTable(r.Topic)
}

func (r *Rig) offsetsTable() string {
	if r.MySQL {
		return wsql.DefaultMySQLOffsetsAdapter{}.MessagesOffsetsTable(r.Topic)
	}
	return wsql.DefaultPostgreSQLOffsetsAdapter{}.MessagesOffsetsTable(r.Topic)
}

// Publisher publishes to the topic outside any transaction.
func (r *Rig) Publisher(t testing.TB) message.Publisher {
	var (
		pub message.Publisher
		err error
	)
	switch {
	case r.Version == 3 && r.MySQL:
		pub, err = wsqlv3.NewPublisher(r.DB, wsqlv3.PublisherConfig{SchemaAdapter: wsqlv3.DefaultMySQLSchema{}}, nil)
	case r.Version == 3:
		pub, err = wsqlv3.NewPublisher(r.DB, wsqlv3.PublisherConfig{SchemaAdapter: wsqlv3.DefaultPostgreSQLSchema{}}, nil)
	case r.MySQL:
		pub, err = wsql.NewPublisher(wsql.BeginnerFromStdSQL(r.DB), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultMySQLSchema{}}, nil)
	default:
		pub, err = wsql.NewPublisher(wsql.BeginnerFromStdSQL(r.DB), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, nil)
	}
	require.NoError(t, err)
	return pub
}

// TxPublisher publishes to the topic inside tx: the construction an
// inbox.Config.ProducedPublisher needs.
func (r *Rig) TxPublisher(tx *sql.Tx) (message.Publisher, error) {
	switch {
	case r.Version == 3 && r.MySQL:
		return wsqlv3.NewPublisher(tx, wsqlv3.PublisherConfig{SchemaAdapter: wsqlv3.DefaultMySQLSchema{}}, nil)
	case r.Version == 3:
		return wsqlv3.NewPublisher(tx, wsqlv3.PublisherConfig{SchemaAdapter: wsqlv3.DefaultPostgreSQLSchema{}}, nil)
	case r.MySQL:
		return wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultMySQLSchema{}}, nil)
	}
	return wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, nil)
}

// Subscriber is SubscriberWith watermill-sql's default AckDeadline. Give it
// to a router, which closes it (closing a v3 subscriber twice is a data
// race).
func (r *Rig) Subscriber(t testing.TB) message.Subscriber {
	sub, err := r.SubscriberWith(30 * time.Second)
	require.NoError(t, err)
	return sub
}

// Poll is how often a test subscriber polls, and how soon it resends a
// nacked message, so that tests stay short.
const Poll = 10 * time.Millisecond

// SubscriberWith is a subscriber on database/sql that gives up waiting for
// an ack after ackDeadline.
func (r *Rig) SubscriberWith(ackDeadline time.Duration) (message.Subscriber, error) {
	if r.Version == 3 {
		c := wsqlv3.SubscriberConfig{
			SchemaAdapter: wsqlv3.DefaultPostgreSQLSchema{}, OffsetsAdapter: wsqlv3.DefaultPostgreSQLOffsetsAdapter{},
			PollInterval: Poll, ResendInterval: Poll, RetryInterval: Poll, AckDeadline: &ackDeadline,
		}
		if r.MySQL {
			c.SchemaAdapter, c.OffsetsAdapter = wsqlv3.DefaultMySQLSchema{}, wsqlv3.DefaultMySQLOffsetsAdapter{}
		}
		return wsqlv3.NewSubscriber(r.DB, c, nil)
	}
	return wsql.NewSubscriber(wsql.BeginnerFromStdSQL(r.DB), r.V4Config(ackDeadline), nil)
}

// V4Config is the v4 subscriber configuration of SubscriberWith.
func (r *Rig) V4Config(ackDeadline time.Duration) wsql.SubscriberConfig {
	c := wsql.SubscriberConfig{
		SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
		PollInterval: Poll, ResendInterval: Poll, RetryInterval: Poll, AckDeadline: &ackDeadline,
	}
	if r.MySQL {
		c.SchemaAdapter, c.OffsetsAdapter = wsql.DefaultMySQLSchema{}, wsql.DefaultMySQLOffsetsAdapter{}
	}
	return c
}

// SubscriberTx is what watermill-sql's TxFromContext returns, as a *sql.Tx.
func (r *Rig) SubscriberTx(ctx context.Context) (*sql.Tx, bool) {
	if r.Version == 3 {
		return wsqlv3.TxFromContext(ctx)
	}
	tx, ok := wsql.TxFromContext(ctx)
	if !ok {
		return nil, false
	}
	std, ok := tx.(*wsql.StdSQLTx)
	if !ok {
		return nil, false
	}
	return std.Tx, true
}

// Count is the exactly-once-delivery-counter's handler: read the counter,
// write value+1, and log the event, in tx.
func (r *Rig) Count(ctx context.Context, tx *sql.Tx, eventID string) error {
	var value int
	if err := tx.QueryRowContext(ctx, `SELECT value FROM `+r.Counter+` WHERE id = 1`).Scan(&value); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, r.Rebind(`UPDATE `+r.Counter+` SET value = ? WHERE id = 1`), value+1); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, r.Rebind(`INSERT INTO `+r.Effects+` (event_id) VALUES (?)`), eventID)
	return err
}

// PublishCopies publishes events events copies times, in rounds, every
// copy with its event's UUID, as a relay publishing it again would.
func (r *Rig) PublishCopies(t testing.TB, events, copies int) []string {
	t.Helper()
	ids := make([]string, events)
	for i := range ids {
		ids[i] = watermill.NewUUID()
	}
	pub := r.Publisher(t)
	for range copies {
		msgs := make([]*message.Message, 0, events)
		for _, id := range ids {
			msgs = append(msgs, message.NewMessage(id, []byte(`{}`)))
		}
		require.NoError(t, pub.Publish(r.Topic, msgs...))
	}
	return ids
}

// Rows counts the topic's messages.
func (r *Rig) Rows(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, r.DB.QueryRow(`SELECT COUNT(*) FROM `+r.MessagesTable()).Scan(&n))
	return n
}

// Drained reports whether the consumer group has acked the topic's last
// message.
func (r *Rig) Drained(t testing.TB) bool {
	var last, acked sql.NullInt64
	col := `"offset"`
	if r.MySQL {
		col = "`offset`"
	}
	require.NoError(t, r.DB.QueryRow(`SELECT MAX(`+col+`) FROM `+r.MessagesTable()).Scan(&last))
	require.NoError(t, r.DB.QueryRow(`SELECT MAX(offset_acked) FROM `+r.offsetsTable()).Scan(&acked))
	return last.Valid && acked.Valid && acked.Int64 >= last.Int64
}

// WaitDrained waits until Drained.
func (r *Rig) WaitDrained(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool { return r.Drained(t) }, WaitFor, Poll, "the consumer did not ack the whole topic")
}

// Outcome is what the tables hold.
type Outcome struct {
	Counter, Effects, DistinctEffects, Claims int
}

// Outcome reads the counter, the effect log and the inbox.
func (r *Rig) Outcome(t testing.TB) Outcome {
	var o Outcome
	require.NoError(t, r.DB.QueryRow(`SELECT value FROM `+r.Counter+` WHERE id = 1`).Scan(&o.Counter))
	require.NoError(t, r.DB.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT event_id) FROM `+r.Effects).Scan(&o.Effects, &o.DistinctEffects))
	require.NoError(t, r.DB.QueryRow(`SELECT COUNT(*) FROM `+r.Inbox).Scan(&o.Claims))
	return o
}

// Exactly is the outcome of n events each applied once.
func Exactly(n int) Outcome { return Outcome{Counter: n, Effects: n, DistinctEffects: n, Claims: n} }

// RunRouter runs handler on topic behind the middlewares, outermost first,
// until the returned stop is called or the test ends.
func RunRouter(t testing.TB, sub message.Subscriber, topic string, handler message.NoPublishHandlerFunc, mws ...message.HandlerMiddleware) (stop func()) {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: WaitFor}, nil)
	require.NoError(t, err)
	router.AddMiddleware(mws...)
	router.AddConsumerHandler("counter", topic, sub, handler)
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("router stopped: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			require.NoError(t, router.Close())
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return stop
}

// FirstResult runs a handler behind mw until the first message comes back
// out of mw, and returns how often the handler ran and mw's result for it.
func FirstResult(t testing.TB, sub message.Subscriber, topic string, mw message.HandlerMiddleware) (calls int64, result error) {
	t.Helper()
	first := make(chan error, 1)
	record := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			select {
			case first <- err:
			default:
			}
			return out, err
		}
	}
	var n atomic.Int64
	stop := RunRouter(t, sub, topic, func(*message.Message) error {
		n.Add(1)
		return nil
	}, record, mw)
	select {
	case result = <-first:
	case <-time.After(WaitFor):
		t.Fatal("no message reached the middleware")
	}
	stop()
	return n.Load(), result
}
