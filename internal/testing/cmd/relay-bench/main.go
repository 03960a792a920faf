// Command relay-bench measures outbox relays on MySQL/MariaDB side by side
// in one process, in interleaved rounds: watermill-sql v4's queue relay
// reading one row a batch (the configuration docs/outbox.md recommended
// before) and reading 100 rows a batch behind inbox.RelaySubscriber with no
// AckDeadline (the one it recommends now), and the PostgreSQL relay
// docs/outbox.md recommends for reference (-postgres-dsn). Each relay is Watermill's
// forwarder from the outbox table to an in-process Kafka broker, published
// by watermill-kafka's synchronous producer, as users run it.
//
// From internal/testing, the test rig's module:
//
//	go run ./cmd/relay-bench                                  # 5 rounds, 5,000 rows, 8 producers for 10 s
//	go run ./cmd/relay-bench -rounds 3 -duration 5s -producers 16
//
// Per relay and round it measures:
//
//   - drain: the rate at which one relay, then two replicas, publish an
//     outbox table filled beforehand with -rows rows;
//   - live: -producers goroutines each write one message per transaction
//     as fast as they can for -duration while one relay runs: the rates
//     written and published, the backlog (rows left) at the end and how long
//     the relay then takes to publish it (given -duration at most), and the
//     p99 delay from the outbox write (its commit follows at once) to the
//     broker's ack of the publish.
//
// It prints per relay the median of the rounds with the spread (min-max),
// and per round the ratio of the batch relay's drain rate to the one-row
// relay's, measured under the same load.
package main

import (
	"context"
	stdsql "database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/bench"
	"github.com/watermill-inbox/inbox/internal/testing/kafkatest"
)

type options struct {
	dsn       string
	pgDSN     string // "": no PostgreSQL relay
	rows      int
	producers int
	duration  time.Duration
	rounds    int
	// readCommitted adds readCommittedRelay.
	readCommitted bool
	out           io.Writer
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "mysql-dsn", env("root@tcp(127.0.0.1:3306)/test", "INBOX_BENCH_MYSQL_DSN", "INBOX_TEST_MYSQL_DSN"),
		"MySQL/MariaDB DSN (default: $INBOX_BENCH_MYSQL_DSN, $INBOX_TEST_MYSQL_DSN, or the local test database)")
	flag.StringVar(&o.pgDSN, "postgres-dsn", env("postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "INBOX_BENCH_POSTGRES_DSN", "INBOX_TEST_POSTGRES_DSN"),
		"PostgreSQL URL of the recommended PostgreSQL relay, measured beside them (empty: none)")
	flag.IntVar(&o.rows, "rows", 5000, "rows in the outbox table the drain measurement starts from")
	flag.IntVar(&o.producers, "producers", 8, "producers writing during the live measurement")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "length of the live measurement")
	flag.IntVar(&o.rounds, "rounds", 5, "interleaved rounds")
	flag.BoolVar(&o.readCommitted, "read-committed", false, "also the batch relay reading in READ COMMITTED instead of the queue schema's SERIALIZABLE: what its lock on the end of the table costs producers (measured only, not proven exact)")
	flag.Parse()
	o.out = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "relay-bench:", err)
		os.Exit(1)
	}
}

func env(def string, names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return def
}

var logger = watermill.NopLogger{}

// relayConfig is one relay under measurement.
type relayConfig struct {
	name string
	// subscriber is the relay's subscriber, as the forwarder gets it.
	subscriber func(db *stdsql.DB) (message.Subscriber, error)
	postgres   bool // on PostgreSQL, else MySQL/MariaDB
}

// pollInterval is how long a relay waits after finding the table empty
// (watermill-sql's default: 1 s), which bounds the delay of a relay that
// keeps up.
const pollInterval = 100 * time.Millisecond

var relays = []relayConfig{
	{name: "v4 queue, batch 1 (before)", subscriber: func(db *stdsql.DB) (message.Subscriber, error) {
		return wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
			PollInterval:   pollInterval,
			SchemaAdapter:  wsql.MySQLQueueSchema{SubscribeBatchSize: 1},
			OffsetsAdapter: wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: true},
		}, logger)
	}},
	{name: "v4 queue, batch 100, RelaySubscriber", subscriber: func(db *stdsql.DB) (message.Subscriber, error) {
		noDeadline := time.Duration(0)
		sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
			PollInterval:   pollInterval,
			SchemaAdapter:  wsql.MySQLQueueSchema{SubscribeBatchSize: 100},
			OffsetsAdapter: wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: true},
			AckDeadline:    &noDeadline,
		}, logger)
		if err != nil {
			return nil, err
		}
		return inbox.RelaySubscriber(sub), nil
	}},
}

// readCommittedRelay is the batch relay with its reads in READ COMMITTED.
// The queue schema reads in SERIALIZABLE: when a batch reaches the table's
// last row, its FOR UPDATE also locks the gap after it, and every insert
// waits for the batch's commit.
var readCommittedRelay = relayConfig{name: "v4 queue, batch 100, RelaySubscriber, READ COMMITTED", subscriber: func(db *stdsql.DB) (message.Subscriber, error) {
	noDeadline := time.Duration(0)
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		PollInterval:   pollInterval,
		SchemaAdapter:  readCommitted{wsql.MySQLQueueSchema{SubscribeBatchSize: 100}},
		OffsetsAdapter: wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: true},
		AckDeadline:    &noDeadline,
	}, logger)
	if err != nil {
		return nil, err
	}
	return inbox.RelaySubscriber(sub), nil
}}

type readCommitted struct{ wsql.MySQLQueueSchema }

func (readCommitted) SubscribeIsolationLevel() stdsql.IsolationLevel {
	return stdsql.LevelReadCommitted
}

// postgresRelay is the PostgreSQL relay docs/outbox.md recommends, for
// reference.
var postgresRelay = relayConfig{name: "PostgreSQL v4, default schema + offsets", postgres: true, subscriber: func(db *stdsql.DB) (message.Subscriber, error) {
	return postgresSubscriber(db)
}}

func postgresSubscriber(db *stdsql.DB) (*wsql.Subscriber, error) {
	return wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		ConsumerGroup: "relay", PollInterval: pollInterval,
		SchemaAdapter:  wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
	}, logger)
}

// sample is one relay's measurement in one round.
type sample struct {
	drain1, drain2    float64 // rows/s
	produced, relayed float64 // msgs/s during the live run
	backlog           int
	gone              time.Duration // from the producers' stop until the backlog is published; -1: not within o.duration
	p99               time.Duration
}

func run(ctx context.Context, o options) error {
	db, err := open("mysql", o.dsn, o.producers)
	if err != nil {
		return err
	}
	defer db.Close()
	cluster, err := kafkatest.NewCluster()
	if err != nil {
		return err
	}
	defer cluster.Close()
	kafkaPub, err := newKafkaPublisher(cluster.ListenAddrs())
	if err != nil {
		return err
	}
	defer kafkaPub.Close()
	m := &meter{db: db, kafka: kafkaPub, addrs: cluster.ListenAddrs(), cluster: cluster, o: o}

	measured := slices.Clone(relays)
	if o.readCommitted {
		measured = append(measured, readCommittedRelay)
	}
	if o.pgDSN != "" {
		measured = append(measured, postgresRelay)
		if m.pg, err = open("pgx", o.pgDSN, o.producers); err != nil {
			return err
		}
		defer m.pg.Close()
	}
	m.relays = measured
	samples := make([][]sample, len(measured))
	for round := range o.rounds {
		idx := make([]int, len(measured))
		for i := range idx {
			idx[i] = i
		}
		if round%2 == 1 { // alternate, so a drifting load weighs on each alike
			slices.Reverse(idx)
		}
		for _, i := range idx {
			r := measured[i]
			s, err := m.measure(ctx, r)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", r.name, round+1, err)
			}
			samples[i] = append(samples[i], s)
			fmt.Fprintf(o.out, "round %d: %s: drain %.0f / %.0f rows/s, live %.0f written / %.0f relayed msgs/s, backlog %d gone after %s, p99 %s\n",
				round+1, r.name, s.drain1, s.drain2, s.produced, s.relayed, s.backlog, goneAfter(s.gone), s.p99.Round(time.Millisecond))
		}
	}
	m.print(samples)
	return nil
}

func open(driver, dsn string, producers int) (*stdsql.DB, error) {
	db, err := stdsql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(producers + 8)
	db.SetMaxIdleConns(producers + 8)
	if err := db.Ping(); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// meter runs the measurements.
type meter struct {
	db      *stdsql.DB // MySQL/MariaDB
	pg      *stdsql.DB
	kafka   message.Publisher
	addrs   []string
	relays  []relayConfig
	cluster interface {
		CreateTopic(string, int32, map[string]string) error
	}
	o options
}

func (m *meter) measure(ctx context.Context, r relayConfig) (sample, error) {
	var s sample
	var err error
	if s.drain1, err = m.drain(ctx, r, 1); err != nil {
		return s, err
	}
	if s.drain2, err = m.drain(ctx, r, 2); err != nil {
		return s, err
	}
	return m.live(ctx, r, s)
}

// outbox is one outbox table, its relays and the Kafka topic they publish
// to.
type outbox struct {
	m          *meter
	r          relayConfig
	db         *stdsql.DB
	topic      string // the SQL topic, table watermill_<topic>
	kafkaTopic string
	published  atomic.Int64
	mu         sync.Mutex
	delays     []time.Duration
	stops      []func()
}

func (m *meter) newOutbox(ctx context.Context, r relayConfig) (*outbox, error) {
	ob := &outbox{m: m, r: r, db: m.db, topic: bench.Name("relay_bench"), kafkaTopic: bench.Name("relayed")}
	if err := m.cluster.CreateTopic(ob.kafkaTopic, 4, nil); err != nil {
		return nil, err
	}
	var sub *wsql.Subscriber
	var err error
	if r.postgres {
		ob.db = m.pg
		sub, err = postgresSubscriber(m.pg)
	} else {
		sub, err = wsql.NewSubscriber(wsql.BeginnerFromStdSQL(m.db), wsql.SubscriberConfig{
			SchemaAdapter: wsql.MySQLQueueSchema{}, OffsetsAdapter: wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: true},
		}, logger)
	}
	if err != nil {
		return nil, err
	}
	if err := sub.SubscribeInitialize(ob.topic); err != nil {
		return nil, err
	}
	return ob, sub.Close()
}

// drop stops the relays and drops the table.
func (ob *outbox) drop(ctx context.Context) {
	for _, stop := range ob.stops {
		stop()
	}
	drop := "DROP TABLE IF EXISTS `watermill_" + ob.topic + "`"
	if ob.r.postgres {
		drop = fmt.Sprintf(`DROP TABLE IF EXISTS "watermill_%[1]s", "watermill_offsets_%[1]s"`, ob.topic)
	}
	_, _ = ob.db.ExecContext(context.WithoutCancel(ctx), drop)
}

// Publish is the relay's publisher: Kafka, then the count and the delay of
// each message the broker acked.
func (ob *outbox) Publish(topic string, msgs ...*message.Message) error {
	if err := ob.m.kafka.Publish(topic, msgs...); err != nil {
		return err
	}
	now := time.Now()
	ob.mu.Lock()
	for _, msg := range msgs {
		if ns, err := strconv.ParseInt(msg.Metadata.Get("written_at"), 10, 64); err == nil {
			ob.delays = append(ob.delays, now.Sub(time.Unix(0, ns)))
		}
	}
	ob.mu.Unlock()
	ob.published.Add(int64(len(msgs)))
	return nil
}

func (ob *outbox) Close() error { return nil }

// startRelay runs a replica of r's relay on the outbox until drop.
func (ob *outbox) startRelay(r relayConfig) error {
	sub, err := r.subscriber(ob.db)
	if err != nil {
		return err
	}
	fwd, err := forwarder.NewForwarder(sub, ob, logger, forwarder.Config{ForwarderTopic: ob.topic, CloseTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fwd.Run(ctx) }()
	select {
	case <-fwd.Running():
	case err := <-done:
		cancel()
		return fmt.Errorf("relay stopped at start: %w", err)
	}
	ob.stops = append(ob.stops, func() { cancel(); <-done })
	return nil
}

// publisher is an outbox publisher bound to tx, as a producer's.
func (ob *outbox) publisher(tx *stdsql.Tx) (message.Publisher, error) {
	var schema wsql.SchemaAdapter = wsql.MySQLQueueSchema{}
	if ob.r.postgres {
		schema = wsql.DefaultPostgreSQLSchema{}
	}
	pub, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: schema}, logger)
	if err != nil {
		return nil, err
	}
	return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: ob.topic}), nil
}

// write writes msgs to the outbox in one transaction.
func (ob *outbox) write(ctx context.Context, msgs ...*message.Message) error {
	tx, err := ob.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	pub, err := ob.publisher(tx)
	if err == nil {
		err = pub.Publish(ob.kafkaTopic, msgs...)
	}
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// backlogQuery counts the rows the relays have not published.
func (ob *outbox) backlogQuery() string {
	if ob.r.postgres {
		return fmt.Sprintf(`SELECT count(*) FROM "watermill_%[1]s" m WHERE NOT EXISTS (SELECT FROM "watermill_offsets_%[1]s" o
			WHERE (m.transaction_id, m."offset") <= (o.last_processed_transaction_id, o.offset_acked))`, ob.topic)
	}
	return "SELECT count(*) FROM `watermill_" + ob.topic + "`"
}

func newMessage() *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":1}`))
	msg.Metadata.Set("written_at", strconv.FormatInt(time.Now().UnixNano(), 10))
	return msg
}

// drain fills an outbox with o.rows rows, then starts replicas relays and
// returns the rate at which they publish them.
func (m *meter) drain(ctx context.Context, r relayConfig, replicas int) (float64, error) {
	ob, err := m.newOutbox(ctx, r)
	if err != nil {
		return 0, err
	}
	defer ob.drop(ctx)
	for written := 0; written < m.o.rows; {
		batch := make([]*message.Message, min(500, m.o.rows-written))
		for i := range batch {
			batch[i] = newMessage()
		}
		if err := ob.write(ctx, batch...); err != nil {
			return 0, err
		}
		written += len(batch)
	}
	start := time.Now()
	for range replicas {
		if err := ob.startRelay(r); err != nil {
			return 0, err
		}
	}
	for ob.published.Load() < int64(m.o.rows) {
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return 0, err
		}
		if time.Since(start) > 10*time.Minute {
			return 0, errors.New("the drain did not end in 10 minutes")
		}
	}
	return float64(m.o.rows) / time.Since(start).Seconds(), nil
}

// live runs o.producers producers for o.duration beside one relay.
func (m *meter) live(ctx context.Context, r relayConfig, s sample) (sample, error) {
	ob, err := m.newOutbox(ctx, r)
	if err != nil {
		return s, err
	}
	defer ob.drop(ctx)
	if err := ob.startRelay(r); err != nil {
		return s, err
	}
	runCtx, cancel := context.WithTimeout(ctx, m.o.duration)
	defer cancel()
	var written atomic.Int64
	errs := make(chan error, m.o.producers)
	var wg sync.WaitGroup
	start := time.Now()
	for range m.o.producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				if err := ob.write(runCtx, newMessage()); err != nil {
					if runCtx.Err() == nil {
						errs <- err
					}
					return
				}
				written.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	relayed := ob.published.Load()
	select {
	case err := <-errs:
		return s, err
	default:
	}
	if err := ctx.Err(); err != nil {
		return s, err
	}
	if err := ob.db.QueryRowContext(ctx, ob.backlogQuery()).Scan(&s.backlog); err != nil {
		return s, err
	}
	s.produced = float64(written.Load()) / elapsed.Seconds()
	s.relayed = float64(relayed) / elapsed.Seconds()
	s.gone = -1
	for stopped := time.Now(); time.Since(stopped) < m.o.duration; {
		if ob.published.Load() >= written.Load() {
			s.gone = time.Since(stopped)
			break
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return s, err
		}
	}
	ob.mu.Lock()
	s.p99 = quantile(ob.delays, 0.99)
	ob.mu.Unlock()
	return s, nil
}

func goneAfter(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(10 * time.Millisecond).String()
}

// goneSeconds is d in seconds, +Inf for a backlog still there after limit.
func goneSeconds(d, limit time.Duration) float64 {
	if d < 0 {
		return math.Inf(1)
	}
	return d.Seconds()
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func newKafkaPublisher(addrs []string) (*kafka.Publisher, error) {
	return kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               addrs,
		Marshaler:             kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: kafka.DefaultSaramaSyncPublisherConfig(),
	}, logger)
}

// print prints per relay the median of each measurement with its spread,
// and the per-round ratios of the drain rates.
func (m *meter) print(samples [][]sample) {
	w := tabwriter.NewWriter(m.o.out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\nrelay\tdrain %d rows, 1 relay\t2 relays\tlive: written msgs/s\trelayed msgs/s\tbacklog after %s\tgone after (s)\tp99 write to broker\n",
		m.o.rows, m.o.duration)
	for i, r := range m.relays {
		ss := samples[i]
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.name,
			spread(ss, func(s sample) float64 { return s.drain1 }, "%.0f"),
			spread(ss, func(s sample) float64 { return s.drain2 }, "%.0f"),
			spread(ss, func(s sample) float64 { return s.produced }, "%.0f"),
			spread(ss, func(s sample) float64 { return s.relayed }, "%.0f"),
			spread(ss, func(s sample) float64 { return float64(s.backlog) }, "%.0f"),
			spread(ss, func(s sample) float64 { return goneSeconds(s.gone, m.o.duration) }, "%.1f"),
			spread(ss, func(s sample) float64 { return s.p99.Seconds() * 1000 }, "%.0f ms"))
	}
	_ = w.Flush()
	fmt.Fprintln(m.o.out)
	for j := 1; j < len(m.relays); j++ {
		if m.relays[j].postgres {
			continue // another database: no ratio
		}
		var ratios1, ratios2, live []float64
		for round := range samples[0] {
			before, after := samples[0][round], samples[j][round]
			ratios1 = append(ratios1, after.drain1/before.drain1)
			ratios2 = append(ratios2, after.drain2/before.drain2)
			live = append(live, after.relayed/before.relayed)
		}
		fmt.Fprintf(m.o.out, "%s over %s, per round: drain, 1 relay %s; 2 relays %s; live relayed %s\n",
			m.relays[j].name, m.relays[0].name, ratioSpread(ratios1), ratioSpread(ratios2), ratioSpread(live))
	}
}

// spread is the median of f over ss, with the smallest and largest.
func spread(ss []sample, f func(sample) float64, format string) string {
	vs := make([]float64, len(ss))
	for i, s := range ss {
		vs[i] = f(s)
	}
	slices.Sort(vs)
	med := fmt.Sprintf(format, vs[len(vs)/2])
	if len(vs) == 1 {
		return med
	}
	return fmt.Sprintf("%s ("+format+"-"+format+")", med, vs[0], vs[len(vs)-1])
}

func ratioSpread(vs []float64) string {
	vs = slices.Clone(vs)
	slices.Sort(vs)
	return fmt.Sprintf("%.1fx (%.1f-%.1f)", vs[len(vs)/2], vs[0], vs[len(vs)-1])
}
