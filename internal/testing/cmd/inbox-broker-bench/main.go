// Command inbox-broker-bench measures batches from a broker: events
// published to RabbitMQ (-broker rabbitmq) or NATS JetStream (-broker
// nats), then consumed by replicas that write one row per event to
// PostgreSQL (pgx through database/sql), three ways side by side in
// interleaved rounds, so that every ratio compares runs made under the same
// load:
//
//   - inbox: the per-message inbox (a Watermill router with the
//     middleware), one handler per replica, on watermill-amqp's subscriber
//     (RabbitMQ) or on natssource with one message unacked per replica;
//   - batch: inbox.BatchConsumer.Run on the broker's batch source
//     (sources/amqpsource, sources/natssource), MaxSize -size;
//   - bare: the same batches from the same source, written in one
//     transaction each without the inbox.
//
// Each run publishes -events events to a queue or stream of its own, then
// starts -replicas replicas and measures from the first delivery to the
// last ack. It prints per mode msgs/s (median of the rounds, with their
// range), p99 of a message's time from its delivery to its ack, the batch
// sizes reached, and the ratios batch/inbox and batch/bare (medians of the
// per-round ratios, with their range).
//
// From internal/testing, the test rig's module:
//
//	go run ./cmd/inbox-broker-bench -events 10000 -rounds 5
//	go run ./cmd/inbox-broker-bench -broker nats -events 10000 -rounds 5
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

type options struct {
	amqpURL, natsURL, dsn    string
	broker                   broker
	events, rounds, replicas int
	size                     int
	wait                     time.Duration
	out, progress            io.Writer
}

func main() {
	o := options{out: os.Stdout, progress: os.Stderr}
	brokerName := flag.String("broker", "rabbitmq", "rabbitmq or nats")
	flag.StringVar(&o.natsURL, "nats", env("INBOX_TEST_NATS_URL", "nats://127.0.0.1:4222"), "NATS URL")
	flag.StringVar(&o.amqpURL, "amqp", env("INBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.StringVar(&o.dsn, "dsn", testdb.PostgresDSN(), "PostgreSQL URL")
	flag.IntVar(&o.events, "events", 10000, "events per run")
	flag.IntVar(&o.rounds, "rounds", 5, "interleaved rounds")
	flag.IntVar(&o.replicas, "replicas", 2, "replicas per run")
	flag.IntVar(&o.size, "size", 100, "batch MaxSize (and half the source's prefetch)")
	flag.DurationVar(&o.wait, "wait", inbox.DefaultMaxBatchWait, "batch MaxWait")
	flag.Parse()
	var err error
	if o.broker, err = brokerNamed(*brokerName); err != nil {
		fmt.Fprintln(os.Stderr, "inbox-broker-bench:", err)
		os.Exit(2)
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "inbox-broker-bench:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// mode starts one replica consuming queue into the tables of r.
type mode struct {
	name  string
	start func(ctx context.Context, o options, r *runState) (stop func() error, err error)
}

var modes = []mode{{"inbox", startInbox}, {"batch", startBatch}, {"bare", startBare}}

// result is what one run measured.
type result struct {
	rate      float64
	latencies []time.Duration
	sizes     []int
}

func run(ctx context.Context, o options) error {
	db, err := sql.Open("pgx", o.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(4 * o.replicas)
	results := make([][]result, len(modes))
	for round := range o.rounds {
		for i := range modes {
			m := (round + i) % len(modes) // each mode goes first in turn
			res, err := runOnce(ctx, o, db, modes[m])
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", modes[m].name, round+1, err)
			}
			results[m] = append(results[m], res)
			fmt.Fprintf(o.progress, "round %d %s: %.0f msgs/s\n", round+1, modes[m].name, res.rate)
		}
	}
	report(o, results)
	return nil
}

// runState is one run's queue, tables and measurements.
type runState struct {
	db      *sql.DB
	store   *sqlinbox.Store
	queue   string
	effects string

	mu        sync.Mutex
	first     time.Time
	latencies []time.Duration
	sizes     []int
	acked     atomic.Int64
	done      chan struct{}
	events    int64
}

// runOnce publishes o.events events and measures one mode consuming them.
func runOnce(ctx context.Context, o options, db *sql.DB, m mode) (result, error) {
	r := &runState{db: db, queue: testdb.Name("bench"), effects: testdb.Name("bench_effects"), done: make(chan struct{}), events: int64(o.events)}
	var err error
	table := testdb.Name("bench_inbox")
	r.store, err = sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table})
	if err != nil {
		return result{}, err
	}
	if err := r.store.CreateSchema(ctx); err != nil {
		return result{}, err
	}
	defer db.Exec(`DROP TABLE IF EXISTS ` + table + `, ` + r.store.LeaseTable() + `, ` + r.effects)
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+r.effects+` (id bigserial PRIMARY KEY, event_id text NOT NULL)`); err != nil {
		return result{}, err
	}
	remove, err := o.broker.publish(o, r.queue)
	if err != nil {
		return result{}, err
	}
	defer remove()
	var stops []func() error
	for range o.replicas {
		stop, err := m.start(ctx, o, r)
		if err != nil {
			return result{}, err
		}
		stops = append(stops, stop)
	}
	select {
	case <-r.done:
	case <-time.After(10 * time.Minute):
		err = fmt.Errorf("%d of %d events acked after 10 minutes", r.acked.Load(), o.events)
	}
	end := time.Now()
	for _, stop := range stops {
		err = errors.Join(err, stop())
	}
	if err != nil {
		return result{}, err
	}
	var rows, distinct int
	if err := db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+r.effects).Scan(&rows, &distinct); err != nil {
		return result{}, err
	}
	if rows != o.events || distinct != o.events {
		return result{}, fmt.Errorf("%d effects of %d events, want one of each of %d", rows, distinct, o.events)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return result{rate: float64(o.events) / end.Sub(r.first).Seconds(), latencies: r.latencies, sizes: r.sizes}, nil
}

// timed wraps a subscriber: it times each message from its delivery to its
// ack, and ends the run at the last ack.
type timed struct {
	message.Subscriber
	r *runState
}

func (s timed) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for msg := range in {
			at := time.Now()
			s.r.mu.Lock()
			if s.r.first.IsZero() {
				s.r.first = at
			}
			s.r.mu.Unlock()
			go func() {
				select {
				case <-msg.Acked():
				case <-msg.Nacked():
					return
				}
				s.r.mu.Lock()
				s.r.latencies = append(s.r.latencies, time.Since(at))
				s.r.mu.Unlock()
				if s.r.acked.Add(1) == s.r.events {
					close(s.r.done)
				}
			}()
			select {
			case out <- msg:
			case <-ctx.Done():
				msg.Nack()
				return
			}
		}
	}()
	return out, nil
}

// insert writes one effect row per id in tx.
func (r *runState) insert(ctx context.Context, tx *sql.Tx, msgs []*message.Message) error {
	ids := make([]string, len(msgs))
	for i, msg := range msgs {
		ids[i] = msg.UUID
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO `+r.effects+` (event_id) SELECT unnest($1::text[])`, ids)
	return err
}

func (r *runState) batchDone(n int) {
	r.mu.Lock()
	r.sizes = append(r.sizes, n)
	r.mu.Unlock()
}

func startInbox(ctx context.Context, o options, r *runState) (func() error, error) {
	sub, err := o.broker.perMessage(o, r.queue)
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: r.store, Consumer: "bench"})
	if err != nil {
		return nil, err
	}
	router.AddConsumerHandler("bench", r.queue, timed{sub, r}, func(msg *message.Message) error {
		tx, _ := inbox.TxFromContext(msg.Context())
		if err := r.insert(msg.Context(), tx, []*message.Message{msg}); err != nil {
			return err
		}
		r.batchDone(1)
		return nil
	}).AddMiddleware(mw)
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	return router.Close, nil
}

func startBatch(ctx context.Context, o options, r *runState) (func() error, error) {
	c, err := inbox.NewBatchConsumer(inbox.BatchConfig{Store: r.store, Consumer: "bench", MaxSize: o.size, MaxWait: o.wait},
		func(ctx context.Context, msgs []*message.Message) error {
			tx, _ := inbox.TxFromContext(ctx)
			if err := r.insert(ctx, tx, msgs); err != nil {
				return err
			}
			r.batchDone(len(msgs))
			return nil
		})
	if err != nil {
		return nil, err
	}
	return runSource(ctx, o, r, func(ctx context.Context, sub message.Subscriber) error { return c.Run(ctx, sub, r.queue) })
}

func startBare(ctx context.Context, o options, r *runState) (func() error, error) {
	return runSource(ctx, o, r, func(ctx context.Context, sub message.Subscriber) error {
		msgs, err := sub.Subscribe(ctx, r.queue)
		if err != nil {
			return err
		}
		for {
			batch, more := collect(ctx, msgs, o.size, o.wait)
			if len(batch) > 0 {
				if err := bareBatch(ctx, r, batch); err != nil {
					for _, msg := range batch {
						msg.Nack()
					}
				} else {
					for _, msg := range batch {
						msg.Ack()
					}
				}
			}
			if !more {
				return ctx.Err()
			}
		}
	})
}

// bareBatch writes a batch in one transaction, without the inbox.
func bareBatch(ctx context.Context, r *runState, batch []*message.Message) error {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := r.insert(ctx, tx, batch); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	r.batchDone(len(batch))
	return nil
}

// collect reads up to size messages, for at most wait after the first, as
// inbox.BatchConsumer.Run does.
func collect(ctx context.Context, msgs <-chan *message.Message, size int, wait time.Duration) (batch []*message.Message, more bool) {
	var timeout <-chan time.Time // after the first message
	for len(batch) < size {
		select {
		case <-ctx.Done():
			return batch, false
		case <-timeout:
			return batch, true
		case msg, ok := <-msgs:
			if !ok {
				return batch, false
			}
			if timeout == nil {
				timeout = time.After(wait)
			}
			batch = append(batch, msg)
		}
	}
	return batch, true
}

// runSource runs consume on the broker's batch source until stopped.
func runSource(ctx context.Context, o options, r *runState, consume func(context.Context, message.Subscriber) error) (func() error, error) {
	sub, err := o.broker.batch(o, r.queue)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consume(ctx, timed{sub, r}) }()
	return func() error {
		cancel()
		err := <-done
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		return errors.Join(err, sub.Close())
	}, nil
}

func report(o options, results [][]result) {
	fmt.Fprintf(o.out, "%s to PostgreSQL (pgx database/sql), %d events per run, %d replicas, MaxSize %d, MaxWait %s, %d rounds\n",
		o.broker.name, o.events, o.replicas, o.size, o.wait, o.rounds)
	tw := tabwriter.NewWriter(o.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mode\tmsgs/s median\trounds\tp99 delivery to ack\tbatch avg\tbatch max\t")
	for i, m := range modes {
		var rates []float64
		var lat []time.Duration
		var sizes []int
		for _, res := range results[i] {
			rates = append(rates, res.rate)
			lat = append(lat, res.latencies...)
			sizes = append(sizes, res.sizes...)
		}
		slices.Sort(lat)
		sum := 0
		for _, s := range sizes {
			sum += s
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f to %.0f\t%s\t%.1f\t%d\t\n", m.name, median(rates), slices.Min(rates), slices.Max(rates),
			lat[len(lat)*99/100].Round(100*time.Microsecond), float64(sum)/float64(len(sizes)), slices.Max(sizes))
	}
	_ = tw.Flush()
	for _, pair := range [][2]int{{1, 0}, {1, 2}} {
		var per []float64
		for round := range results[pair[0]] {
			per = append(per, results[pair[0]][round].rate/results[pair[1]][round].rate)
		}
		fmt.Fprintf(o.out, "%s / %s: %.2f, rounds %.2f to %.2f\n", modes[pair[0]].name, modes[pair[1]].name, median(per), slices.Min(per), slices.Max(per))
	}
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
