package prommetrics_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	_ "modernc.org/sqlite"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/prommetrics"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// One Metrics per registry, shared by every inbox middleware of the
// process; serve the registry with promhttp.HandlerFor. Here one event is
// delivered three times and the counters say what happened.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file::memory:") // your database
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // each connection to :memory: is a database of its own
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	metrics, err := prommetrics.New(reg, "") // prometheus.DefaultRegisterer with nil
	if err != nil {
		log.Fatal(err)
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "invoicing", Observer: metrics})
	if err != nil {
		log.Fatal(err)
	}
	handler := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for range 3 {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set("event_id", "order-1")
		if _, err := handler(msg); err != nil {
			log.Fatal(err)
		}
	}

	printCounters(reg, "watermill_inbox_messages_total")
	// Output:
	// watermill_inbox_messages_total{consumer="invoicing",outcome="duplicate"} 2
	// watermill_inbox_messages_total{consumer="invoicing",outcome="processed"} 1
}

// PurgeRound is the purge's OnRound hook for one table: each round counts
// as done, skipped (another instance held the purge lock) or failed, and
// the rows it removed add up. Three rounds are reported by hand here.
func ExampleMetrics_PurgeRound() {
	reg := prometheus.NewRegistry()
	metrics, err := prommetrics.New(reg, "")
	if err != nil {
		log.Fatal(err)
	}
	// purge.New(store, purge.Config{Retention: r, OnRound: onRound}) calls
	// it after every round, Run's included.
	onRound := metrics.PurgeRound("watermill_inbox")
	onRound(1200, 2*time.Second, nil)
	onRound(0, 0, fmt.Errorf("purge: held by PostgreSQL backend 4242: %w", purge.ErrSkipped))
	onRound(0, time.Second, errors.New("purge: connection refused"))

	printCounters(reg, "watermill_inbox_purge_")
	// Output:
	// watermill_inbox_purge_rounds_total{result="done",table="watermill_inbox"} 1
	// watermill_inbox_purge_rounds_total{result="failed",table="watermill_inbox"} 1
	// watermill_inbox_purge_rounds_total{result="skipped",table="watermill_inbox"} 1
	// watermill_inbox_purge_rows_deleted_total{table="watermill_inbox"} 1200
}

// printCounters prints the counters of reg whose name starts with prefix,
// as Prometheus's text format writes them.
func printCounters(reg *prometheus.Registry, prefix string) {
	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), prefix) {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetCounter() == nil {
				continue
			}
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			fmt.Printf("%s{%s} %v\n", f.GetName(), strings.Join(labels, ","), m.GetCounter().GetValue())
		}
	}
}

// Rules is a rule file for Prometheus. Write it where rule_files points, with
// the retention in WatermillInboxPurgeStopped edited, and renamed when New
// was given another namespace.
func ExampleRules() {
	// The metrics of prommetrics.New(reg, "shop").
	rules := strings.ReplaceAll(prommetrics.Rules, prommetrics.DefaultNamespace, "shop")
	dir, err := os.MkdirTemp("", "rules") // your Prometheus configuration's directory
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "watermill-inbox-rules.yml"), []byte(rules), 0o644); err != nil {
		log.Fatal(err)
	}

	for _, line := range strings.Split(rules, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "- alert: ") || strings.HasPrefix(line, "- record: consumer_outcome:") {
			fmt.Println(line)
		}
	}
	// Output:
	// - record: consumer_outcome:shop_messages:rate5m
	// - record: consumer_outcome:shop_messages:increase15m
	// - record: consumer_outcome:shop_stale_events:increase15m
	// - alert: WatermillInboxClaimsFailing
	// - alert: WatermillInboxHighRollbackRatio
	// - alert: WatermillInboxInFlightSurge
	// - alert: WatermillInboxPurgeStopped
	// - alert: WatermillInboxTableUnreadable
	// - alert: WatermillInboxPurgeFailing
	// - alert: WatermillInboxPartitionBlocked
	// - alert: WatermillInboxStaleEvents
	// - alert: WatermillInboxEventIDReused
	// - alert: WatermillInboxMiswired
	// - alert: WatermillInboxSuspectedMiswiring
	// - alert: WatermillInboxUnkeyedMessages
}
