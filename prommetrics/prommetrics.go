// Package prommetrics exports the inbox's metrics to Prometheus: an
// [observe.Observer] that counts messages by consumer and outcome and times
// their claims and transactions, and counters for purge rounds.
//
// It lives in its own package so that only programs importing it link
// github.com/prometheus/client_golang.
//
//	metrics, err := prommetrics.New(nil, "") // default registerer, namespace "watermill_inbox"
//	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Observer: metrics})
//
// Create one [Metrics] per [prometheus.Registerer] and share it between every
// middleware of the process: the series are labelled by consumer, and
// registering the same metric names twice fails.
//
// What to alert on: a rate of outcome="claim_failed" or "commit_failed"
// (the database is unhealthy), outcome="in_flight" (two copies of an event
// raced and one waited past the claim timeout), outcome="missing_id" or
// "invalid_id" (a producer sends messages the inbox cannot key),
// outcome="id_reused" (a producer gave one event id to two different events,
// see [inbox.Config.Fingerprint]), outcome="stale" (events older than
// [inbox.Config.MaxEventAge] rejected or skipped), stale_events_total (every
// event older than MaxEventAge, those processed under [inbox.StaleProcess]
// included: their duplicates may have gone unnoticed),
// after_commit_failures_total ([inbox.AfterCommit] hooks that failed or
// panicked: their effects are lost), and a claim latency that grows with
// the inbox table (purge it). [Rules] holds Prometheus rules for most of
// these, each alert with a runbook.
//
// [inbox.AfterCommit]: https://pkg.go.dev/github.com/watermill-inbox/inbox#AfterCommit
// [inbox.Config.Fingerprint]: https://pkg.go.dev/github.com/watermill-inbox/inbox#Config.Fingerprint
// [inbox.Config.MaxEventAge]: https://pkg.go.dev/github.com/watermill-inbox/inbox#Config.MaxEventAge
// [inbox.StaleProcess]: https://pkg.go.dev/github.com/watermill-inbox/inbox#StaleProcess
package prommetrics

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/watermill-inbox/inbox/observe"
)

// DefaultNamespace prefixes every metric name when [New] gets no namespace.
const DefaultNamespace = "watermill_inbox"

// Metrics is an [observe.Observer] recording Prometheus metrics. Its methods are
// safe for concurrent use.
type Metrics struct {
	messages     *prometheus.CounterVec
	stale        *prometheus.CounterVec
	hookFailures *prometheus.CounterVec
	warnings     *prometheus.CounterVec
	claim        *prometheus.HistogramVec
	duration     *prometheus.HistogramVec
	purgeRounds  *prometheus.CounterVec
	purgeDeleted *prometheus.CounterVec
	purgeTime    *prometheus.HistogramVec
	blocked      *prometheus.GaugeVec

	reg       prometheus.Registerer // for WatchOldest
	namespace string
}

var _ observe.Observer = (*Metrics)(nil)

// Buckets in seconds. A claim is one INSERT, normally a millisecond or two,
// longer when it waits for another copy's transaction; a message's time
// includes the handler.
var (
	claimBuckets   = []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	messageBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	purgeBuckets   = []float64{.01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900}
)

// New creates the metrics and registers them with reg, so that they appear
// as soon as a message or a purge is observed. A nil reg means
// [prometheus.DefaultRegisterer]; an empty namespace means [DefaultNamespace].
// Registering twice with one registry fails: share the returned [Metrics].
func New(reg prometheus.Registerer, namespace string) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	if namespace == "" {
		namespace = DefaultNamespace
	}
	m := &Metrics{
		reg:       reg,
		namespace: namespace,
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "messages_total",
			Help:      "Messages that passed through the inbox middleware, by consumer and outcome (processed, duplicate, missing_id, invalid_id, in_flight, claim_failed, miswired, rolled_back, poisoned, commit_failed, id_reused, stale).",
		}, []string{"consumer", "outcome"}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "stale_events_total",
			Help:      "Events older than inbox.Config.MaxEventAge, by consumer and outcome: the outcome is stale when the policy rejected or skipped them, and that of any message when it processed them (its duplicate may have gone unnoticed).",
		}, []string{"consumer", "outcome"}),
		hookFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "after_commit_failures_total",
			Help:      "Processed messages whose inbox.AfterCommit hooks failed or panicked after the commit, by consumer: those hooks' effects are lost.",
		}, []string{"consumer"}),
		warnings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "warnings_total",
			Help:      "Messages processed while the inbox suspected the consumer's wiring, by consumer and warning (tx_unused, wrong_accessor, publisher_outside_tx, shared_consumer, skipping_relay, unchecked); each warning is logged once per process.",
		}, []string{"consumer", "warning"}),
		claim: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "claim_duration_seconds",
			Help:      "Time to begin the transaction and insert the inbox row, waits for a concurrent copy of the same event included.",
			Buckets:   claimBuckets,
		}, []string{"consumer"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "message_duration_seconds",
			Help:      "Time a message spent in the inbox middleware: claim, handler and commit, by consumer and outcome.",
			Buckets:   messageBuckets,
		}, []string{"consumer", "outcome"}),
		purgeRounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "purge_rounds_total",
			Help:      "Purge rounds by inbox table and result (done, skipped, failed).",
		}, []string{"table", "result"}),
		purgeDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "purge_rows_deleted_total",
			Help:      "Inbox rows removed by the purge (dropped partitions included), by table.",
		}, []string{"table"}),
		purgeTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "purge_duration_seconds",
			Help:      "Duration of purge rounds that ran, by table.",
			Buckets:   purgeBuckets,
		}, []string{"table"}),
		blocked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "purge_partitions_blocked",
			Help:      "Partitions the last purge round of the table could not create, because the default partition holds rows of their period (events dated ahead of the clock, on a table partitioned by event time): claims of those periods land in the default partition.",
		}, []string{"table"}),
	}
	for _, c := range []prometheus.Collector{m.messages, m.stale, m.hookFailures, m.warnings, m.claim, m.duration, m.purgeRounds, m.purgeDeleted, m.purgeTime, m.blocked} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("prommetrics: registering inbox metrics: %w", err)
		}
	}
	return m, nil
}

// Start implements [observe.Observer].
func (m *Metrics) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, m.observe
}

func (m *Metrics) observe(ob observe.Observation) {
	outcome := string(ob.Outcome)
	m.messages.WithLabelValues(ob.Consumer, outcome).Inc()
	if ob.Stale {
		m.stale.WithLabelValues(ob.Consumer, outcome).Inc()
	}
	if ob.AfterCommitErr != nil {
		m.hookFailures.WithLabelValues(ob.Consumer).Inc()
	}
	if ob.Warning != "" {
		m.warnings.WithLabelValues(ob.Consumer, string(ob.Warning)).Inc()
	}
	m.duration.WithLabelValues(ob.Consumer, outcome).Observe(ob.Duration.Seconds())
	if !ob.ClaimStart.IsZero() {
		m.claim.WithLabelValues(ob.Consumer).Observe(ob.ClaimDuration.Seconds())
	}
}

// PurgeRound returns the purge hook for table's rounds, Run's included:
//
//	purge.New(store, purge.Config{Retention: r, OnRound: metrics.PurgeRound(store.Table())})
func (m *Metrics) PurgeRound(table string) func(deleted int64, took time.Duration, err error) {
	return func(deleted int64, took time.Duration, err error) { m.ObservePurge(table, deleted, took, err) }
}

// ObservePurge records one purge round of table: what
// [purge.Purger.PurgeOnce] returned and how long it took.
// [Metrics.PurgeRound] calls it from the purge's hook.
//
// [purge.Purger.PurgeOnce]: https://pkg.go.dev/github.com/watermill-inbox/inbox/purge#Purger.PurgeOnce
func (m *Metrics) ObservePurge(table string, deleted int64, d time.Duration, err error) {
	switch {
	case skipped(err):
		m.purgeRounds.WithLabelValues(table, "skipped").Inc()
		return
	case err != nil:
		m.purgeRounds.WithLabelValues(table, "failed").Inc()
	default:
		m.purgeRounds.WithLabelValues(table, "done").Inc()
	}
	m.purgeDeleted.WithLabelValues(table).Add(float64(deleted))
	m.purgeTime.WithLabelValues(table).Observe(d.Seconds())
}

// PartitionsBlocked returns the purge hook that records, after each round
// on table, how many partitions it could not create
// (purge_partitions_blocked), which the rule WatermillInboxPartitionBlocked
// alerts on:
//
//	purge.New(store, purge.Config{Retention: r, OnRound: metrics.PurgeRound(store.Table()),
//		OnPartitionsBlocked: metrics.PartitionsBlocked(store.Table())})
func (m *Metrics) PartitionsBlocked(table string) func(partitions []string) {
	return func(partitions []string) { m.blocked.WithLabelValues(table).Set(float64(len(partitions))) }
}

// skipped reports whether err is purge.ErrSkipped, by its Skipped method:
// importing package purge would link the stores and their database
// drivers into every program that exports metrics.
func skipped(err error) bool {
	var s interface{ Skipped() bool }
	return errors.As(err, &s) && s.Skipped()
}

// OldestClaimer is a store that can tell its oldest row: [sqlinbox.Store] and
// [pgxinbox.Store].
//
// [sqlinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/sqlinbox#Store
// [pgxinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#Store
type OldestClaimer interface {
	Table() string
	OldestClaim(ctx context.Context) (oldest time.Time, ok bool, err error)
}

// OldestTimeout bounds the query [Metrics.WatchOldest] runs on every scrape.
const OldestTimeout = 5 * time.Second

// WatchOldest registers two gauges for store's table, read on every
// scrape with one query (one index entry):
//
//   - oldest_row_timestamp_seconds{table}: when the oldest row still in
//     the table was claimed, as Unix seconds. Its age is time() - the
//     gauge; alert when it exceeds the purge retention by a margin, which
//     means the purge does not run or cannot keep up. An empty table, or a
//     failed read, has no sample.
//   - oldest_row_up{table}: 1 when the read succeeded, 0 when it failed
//     (the database unreachable, the table missing, the user not allowed
//     to read it).
//
// A failed read does not fail the scrape: with the default
// [promhttp.HandlerOpts] an error would answer the whole scrape with HTTP 500,
// and during a database outage the claim failures that should raise an alert
// would not reach Prometheus either. Call it once per table.
//
// [promhttp.HandlerOpts]: https://pkg.go.dev/github.com/prometheus/client_golang/prometheus/promhttp#HandlerOpts
func (m *Metrics) WatchOldest(store OldestClaimer) error {
	labels := prometheus.Labels{"table": store.Table()}
	c := &oldestCollector{
		store: store,
		oldest: prometheus.NewDesc(prometheus.BuildFQName(m.namespace, "", "oldest_row_timestamp_seconds"),
			"When the oldest row still in the inbox table was claimed (database clock), as Unix seconds; time() minus it is the oldest row's age.",
			nil, labels),
		up: prometheus.NewDesc(prometheus.BuildFQName(m.namespace, "", "oldest_row_up"),
			"1 when this scrape read the inbox table's oldest row, 0 when the read failed (database unreachable, table missing, no privilege).",
			nil, labels),
	}
	if err := m.reg.Register(c); err != nil {
		return fmt.Errorf("prommetrics: registering the oldest row gauge of %s: %w", store.Table(), err)
	}
	return nil
}

type oldestCollector struct {
	store      OldestClaimer
	oldest, up *prometheus.Desc
}

func (c *oldestCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.oldest
	ch <- c.up
}

func (c *oldestCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), OldestTimeout)
	defer cancel()
	oldest, ok, err := c.store.OldestClaim(ctx)
	up := 1.0
	switch {
	case err != nil:
		up = 0
	case ok:
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, float64(oldest.UnixNano())/1e9)
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
}
