package servicetest

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "modernc.org/sqlite"             // registers "sqlite"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// HandlerName is every service's handler name.
const HandlerName = "handle_orders"

// Report is what a service prints.
type Report struct {
	Service   string         // the service's name, as the registry records it
	Outcomes  map[string]int // messages per observe.Outcome
	Warnings  map[string]int // messages per observe.Warning
	FirstErr  string         // the error of the first message that failed
	Processed []string       // event ids processed
}

// Main runs one service with its flags and exits: 0 when every message
// went through the inbox (processed, duplicate or refused), 1 otherwise.
func Main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	var (
		driver   = flag.String("driver", "pgx", "database/sql driver: pgx, mysql, sqlite, or pgxpool for a pgxinbox.Store")
		dsn      = flag.String("dsn", "", "data source name")
		table    = flag.String("table", "", "inbox table")
		effects  = flag.String("effects", "", "table (consumer, event_id) the handler inserts into")
		consumer = flag.String("consumer", "", "inbox.Config.Consumer; empty: the handler name")
		events   = flag.Int("events", 3, "orders order-0, order-1, ... to consume")
		pause    = flag.Duration("pause", 0, "how long to wait after the first order, for the lease's first heartbeat")
	)
	flag.Parse()
	ctx := context.Background()

	dialect, ph := map[string]sqlinbox.Dialect{"pgx": sqlinbox.PostgreSQL, "pgxpool": sqlinbox.PostgreSQL, "mysql": sqlinbox.MySQL, "sqlite": sqlinbox.SQLite}[*driver], "?"
	if dialect == sqlinbox.PostgreSQL {
		ph = "$"
	}
	store, exec, done, err := open(ctx, *driver, *dsn, sqlinbox.Config{Dialect: dialect, Table: *table})
	if err != nil {
		return err
	}
	defer done()
	if err := store.(interface{ CreateSchema(context.Context) error }).CreateSchema(ctx); err != nil {
		return err
	}
	insert := fmt.Sprintf("INSERT INTO %s (consumer, event_id) VALUES (%s, %s)", *effects, param(ph, 1), param(ph, 2))

	rep := &report{Report: Report{Outcomes: map[string]int{}, Warnings: map[string]int{}}}
	mw, err := inbox.NewMiddleware(inbox.Config{
		Store:    store,
		Consumer: *consumer,
		Observer: rep,
		Logger:   watermill.NewStdLoggerWithOut(os.Stderr, false, false),
	})
	if err != nil {
		return err
	}
	ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	// Ack whatever the inbox said, so that each order is seen once: the
	// report tells what happened to it.
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			_, _ = h(msg)
			return nil, nil
		}
	})
	router.AddConsumerHandler(HandlerName, "orders", ps, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		id, consumer, _ := inbox.EventIDFromContext(msg.Context())
		if err := exec(msg.Context(), insert, consumer, id); err != nil {
			return err
		}
		rep.processed(id)
		return nil
	}))
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	for i := range *events {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, fmt.Sprintf("order-%d", i))
		if err := ps.Publish("orders", msg); err != nil {
			return err
		}
		if i == 0 {
			time.Sleep(*pause)
		}
	}
	if err := router.Close(); err != nil {
		return err
	}
	rep.Service = serviceName()
	return json.NewEncoder(os.Stdout).Encode(rep.Report)
}

// open returns the store on driver, and how the handler writes in its
// transaction.
func open(ctx context.Context, driver, dsn string, sc sqlinbox.Config) (inboxdriver.Store, func(ctx context.Context, query string, args ...any) error, func(), error) {
	if driver == "pgxpool" {
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			return nil, nil, nil, err
		}
		s, err := pgxinbox.NewStore(pool, sc)
		return s, func(ctx context.Context, query string, args ...any) error {
			tx, ok := pgxinbox.TxFromContext(ctx)
			if !ok {
				return inbox.ErrNotInInbox
			}
			_, err := tx.Exec(ctx, query, args...)
			return err
		}, pool.Close, err
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, nil, nil, err
	}
	s, err := sqlinbox.New(db, sc)
	return s, func(ctx context.Context, query string, args ...any) error {
		tx, ok := inbox.TxFromContext(ctx)
		if !ok {
			return inbox.ErrNotInInbox
		}
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	}, func() { _ = db.Close() }, err
}

func param(ph string, n int) string {
	if ph == "$" {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// report is an observe.Observer that fills a Report.
type report struct {
	mu sync.Mutex
	Report
}

func (r *report) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(ob observe.Observation) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.Outcomes[string(ob.Outcome)]++
		if ob.Warning != "" {
			r.Warnings[string(ob.Warning)]++
		}
		if ob.Err != nil && r.FirstErr == "" && !errors.Is(ob.Err, context.Canceled) {
			r.FirstErr = ob.Err.Error()
		}
	}
}

func (r *report) processed(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Processed = append(r.Processed, id)
}

// serviceName is the name the lease table records for this program when
// inbox.Config.Service is empty: its main package path.
func serviceName() string {
	info, _ := debug.ReadBuildInfo()
	return info.Path
}
