// Command metrics serves the inbox's Prometheus metrics. It delivers every
// order event three times and fails one handler call, then reads its own
// /metrics endpoint: five processed, ten duplicates skipped, one rolled back.
//
//	go run ./_examples/metrics                 # embedded SQLite, prints the counters and exits
//	go run ./_examples/metrics -serve          # keeps serving http://127.0.0.1:2112/metrics
//	go run ./_examples/metrics -dialect postgresql -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run ./_examples/metrics -dialect mysql -dsn 'root@tcp(127.0.0.1:3306)/test'
package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/lib/pq"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	_ "modernc.org/sqlite"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/prommetrics"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

func main() {
	dialect := flag.String("dialect", "sqlite", "sqlite, postgresql or mysql")
	dsn := flag.String("dsn", "", "database DSN (default: a temporary SQLite file)")
	addr := flag.String("addr", "127.0.0.1:2112", "where to serve /metrics")
	serve := flag.Bool("serve", false, "keep serving /metrics until interrupted")
	flag.Parse()
	if err := run(*dialect, *dsn, *addr, *serve); err != nil {
		log.Fatal(err)
	}
}

// database opens the chosen database and returns its dialect and the
// placeholder of its first query parameter.
func database(dialect, dsn string) (db *sql.DB, d sqlinbox.Dialect, ph string, cleanup func(), err error) {
	removeDir := func() {}
	driver := dialect
	switch dialect {
	case "sqlite":
		d, ph = sqlinbox.SQLite, "?"
		if dsn == "" {
			dir, err := os.MkdirTemp("", "inbox-metrics")
			if err != nil {
				return nil, nil, "", nil, err
			}
			removeDir = func() { _ = os.RemoveAll(dir) }
			dsn = sqlinbox.SQLiteDSN(filepath.Join(dir, "shop.db"))
		}
	case "postgresql":
		d, ph, driver = sqlinbox.PostgreSQL, "$1", "postgres" // lib/pq's driver name
	case "mysql":
		d, ph = sqlinbox.MySQL, "?"
	default:
		return nil, nil, "", nil, fmt.Errorf("unknown -dialect %q: sqlite, postgresql or mysql", dialect)
	}
	if dsn == "" {
		return nil, nil, "", nil, fmt.Errorf("-dialect %s needs -dsn", dialect)
	}
	db, err = sql.Open(driver, dsn)
	if err != nil {
		removeDir()
		return nil, nil, "", nil, err
	}
	return db, d, ph, func() { _ = db.Close(); removeDir() }, nil
}

func run(dialect, dsn, addr string, serve bool) error {
	ctx := context.Background()
	db, d, ph, cleanup, err := database(dialect, dsn)
	if err != nil {
		return err
	}
	defer cleanup()
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: d, Table: "metrics_example_inbox"})
	if err != nil {
		return err
	}
	if err := store.CreateSchema(ctx); err != nil {
		return err
	}
	// A fresh start each run, so the counters below match this run.
	for _, q := range []string{
		`DELETE FROM metrics_example_inbox`,
		`DROP TABLE IF EXISTS metrics_example_invoices`,
		`CREATE TABLE metrics_example_invoices (order_id VARCHAR(64) NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}

	// The metrics: one Metrics per registry, shared by every middleware.
	metrics, err := prommetrics.New(nil, "")
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: promhttp.Handler()}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Observer: metrics})
	if err != nil {
		return err
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router.AddMiddleware(middleware.Recoverer, mw)
	failed := false
	router.AddConsumerHandler("invoicing", "orders", pubSub, func(msg *message.Message) error {
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		orderID := msg.Metadata.Get("event_id")
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO metrics_example_invoices (order_id) VALUES (`+ph+`)`, orderID); err != nil {
			return err
		}
		if orderID == "order-3" && !failed { // one handler runs at a time here
			failed = true
			return errors.New("payment service timed out")
		}
		return nil
	})
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	for range 3 {
		for i := 1; i <= 5; i++ {
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			msg.Metadata.Set("event_id", fmt.Sprintf("order-%d", i))
			if err := pubSub.Publish("orders", msg); err != nil {
				return err
			}
		}
	}
	if err := router.Close(); err != nil {
		return err
	}

	url := "http://" + ln.Addr().String() + "/metrics"
	lines, err := scrape(url, "watermill_inbox_messages_total")
	if err != nil {
		return err
	}
	fmt.Printf("GET %s (inbox counters):\n", url)
	for _, l := range lines {
		fmt.Println("  " + l)
	}
	for _, want := range []string{
		`watermill_inbox_messages_total{consumer="invoicing",outcome="processed"} 5`,
		`watermill_inbox_messages_total{consumer="invoicing",outcome="duplicate"} 10`,
		`watermill_inbox_messages_total{consumer="invoicing",outcome="rolled_back"} 1`,
	} {
		if !contains(lines, want) {
			return fmt.Errorf("/metrics lacks %s", want)
		}
	}
	if !serve {
		return nil
	}
	fmt.Printf("serving %s; Ctrl-C to stop\n", url)
	stop, cancel := signal.NotifyContext(ctx, os.Interrupt)
	defer cancel()
	<-stop.Done()
	return nil
}

// scrape returns the lines of the metrics page that start with prefix.
func scrape(url, prefix string) ([]string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var lines []string
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		if strings.HasPrefix(s.Text(), prefix) {
			lines = append(lines, s.Text())
		}
	}
	return lines, s.Err()
}

func contains(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}
