// Command inbox-bench measures what the inbox costs, side by side in one
// process: the same handler and business write (-write; by default one
// row in its own transaction) bare, behind the inbox, fed duplicates, and
// behind Watermill's in-memory Deduplicator, for each driver and concurrency, in interleaved
// rounds so that the ratios compare runs made under the same load.
//
// From internal/testing, the test rig's module:
//
//	go run ./cmd/inbox-bench                               # every driver, c=1,8,32, empty inbox
//	go run ./cmd/inbox-bench -prefill 10000000             # also against an inbox holding 10M claims
//	go run ./cmd/inbox-bench -drivers pgx -prefill 10000000 -prefill-partitioning daily  # 10M claims in daily partitions
//	go run ./cmd/inbox-bench -drivers pgx -c 8 -duration 5s -rounds 5
//	go run ./cmd/inbox-bench -drivers pgx,pgx-stdlib -rtt 500us            # as if the database were 0.5 ms away
//	go run ./cmd/inbox-bench -drivers pgx -write invoice                   # an invoice and a running total per message
//
// On loopback a round trip costs 30-60 µs, which hides what a round trip
// saved is worth (native pgx sends BEGIN with the claim); -rtt puts an
// in-process delay proxy (bench.Latency) between the program and the
// database on every measured connection, bare and inbox alike (the proxy
// runs in this process: its allocations show in the allocs/msg column, and
// its hop adds to each round trip). The default
// business write is the worst case for the ratio (the claim writes as much
// as the handler); -write invoice is a handler's usual write: an indexed row
// and the update of a running total.
//
// Per driver it prints first the cost of one message, measured one at a
// time: round trips on the wire, WAL bytes (PostgreSQL; the smallest of
// several samples, since the server's WAL counts every session) and heap
// allocations in this process. Then, per concurrency, msgs/s, p50/p99
// latency and the ratio to the bare handler (median of the per-round
// ratios).
//
// On PostgreSQL each concurrency also gets the server's floor (-floor,
// on by default): pgbench in pipeline mode with prepared statements runs
// BEGIN, the claim's INSERT ... ON CONFLICT DO NOTHING on a table the
// library created, the same business write, COMMIT, in one round trip,
// against the same without the claim, in the same rounds; the claim's
// rate over the bare one is the best ratio any client could reach, and
// the inbox's distance from it is the client's share (bench.Floor).
//
// With -claim-parts it prints instead what each part of the inbox row
// costs in WAL per claim on PostgreSQL (the row, its primary key, the
// purge's processed_at index, with text and uuid event ids), measured in
// throwaway tables one claim per transaction: what a cheaper claim could
// save.
//
// The Deduplicator is a reference point, not an alternative: it remembers
// ids in memory for a minute, so it forgets them on restart and across
// instances, and it marks a message as seen before the handler runs, so a
// handler error followed by a redelivery drops the message.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/bench"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

type options struct {
	drivers  string
	dsn      string
	mysqlDSN string
	sqlite   string
	conc     []int
	duration time.Duration
	rounds   int
	prefill  int64
	prefillP string
	prefillK string
	prefillT string // the -prefill table, instead of the name kept between runs (tests)
	sample   int
	dupIDs   int
	v7IDs    bool
	modes    string
	kafka    int
	uuidIDs  bool
	rtt      time.Duration
	write    string
	parts    bool
	pooler   string
	floor    bool
	pgbench  string
	batch    []int
	out      io.Writer
}

func main() {
	var o options
	var conc string
	flag.StringVar(&o.drivers, "drivers", "all", "comma-separated drivers: "+driverNames()+", or all")
	flag.StringVar(&o.dsn, "dsn", env("postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "INBOX_BENCH_POSTGRES_DSN", "INBOX_TEST_POSTGRES_DSN"),
		"PostgreSQL URL (default: $INBOX_BENCH_POSTGRES_DSN, $INBOX_TEST_POSTGRES_DSN, or the local test database)")
	flag.StringVar(&o.mysqlDSN, "mysql-dsn", env("root@tcp(127.0.0.1:3306)/test", "INBOX_BENCH_MYSQL_DSN", "INBOX_TEST_MYSQL_DSN"),
		"MySQL/MariaDB DSN (default: $INBOX_BENCH_MYSQL_DSN, $INBOX_TEST_MYSQL_DSN, or the local test database)")
	flag.StringVar(&o.sqlite, "sqlite", "", "SQLite database file (default: a temporary file, removed at exit)")
	flag.StringVar(&conc, "c", "1,8,32", "comma-separated concurrencies (workers and pool size)")
	flag.DurationVar(&o.duration, "duration", 2*time.Second, "length of one measured run of one mode")
	flag.IntVar(&o.rounds, "rounds", 3, "interleaved rounds per concurrency")
	flag.Int64Var(&o.prefill, "prefill", 0, "also run against an inbox already holding this many claims (kept between runs as inbox_bench_prefill_N)")
	flag.StringVar(&o.prefillP, "prefill-partitioning", "none", "layout of the -prefill table: none, daily or monthly (PostgreSQL: sqlinbox.Daily or Monthly, kept as inbox_bench_prefill_daily_N or _monthly_N, the claims spread over the 14 days before today)")
	flag.StringVar(&o.prefillK, "prefill-key", "processed_at", "partition key of a partitioned -prefill table: processed_at, or event_time (sqlinbox.EventIDTime: UUIDv7 ids in a uuid column, kept as inbox_bench_idtime_daily_N; implies -v7-ids)")
	flag.IntVar(&o.sample, "sample", 500, "messages per sample of the one-at-a-time cost pass")
	flag.IntVar(&o.dupIDs, "dup-ids", 1000, "distinct events redelivered by the duplicates mode")
	flag.StringVar(&o.modes, "modes", "all", "comma-separated modes: bare, inbox, dup, dedup (with -prefill also inbox-full, dup-full), or all")
	flag.BoolVar(&o.v7IDs, "v7-ids", false, "new events get time-ordered UUIDv7 ids instead of random UUIDv4 ones")
	flag.BoolVar(&o.uuidIDs, "uuid-ids", false, "the empty inbox stores event ids in a native UUID column (sqlinbox.Config.UUIDEventIDs)")
	flag.DurationVar(&o.rtt, "rtt", 0, "network round trip added to every measured connection by an in-process proxy, e.g. 500us (0: direct; SQLite has no network)")
	flag.StringVar(&o.write, "write", "one-row", "business write per message: "+strings.Join(bench.WriteKinds, ", ")+" (one-row: one row, no index; invoice: an indexed invoice row and a customer's running total)")
	flag.BoolVar(&o.parts, "claim-parts", false, "print what each part of the inbox row costs in WAL per claim on PostgreSQL (needs pg_walinspect), then exit")
	flag.StringVar(&o.pooler, "pooler", "", "PostgreSQL URL of a transaction-pooling proxy (PgBouncer pool_mode=transaction) in front of -dsn's database: PostgreSQL drivers also run bare and inbox through it (modes bare-pooled, inbox-pooled), with the DSN settings and sqlinbox.Config.TransactionPooling docs/poolers.md gives")
	flag.BoolVar(&o.floor, "floor", true, "PostgreSQL: beside the inbox's ratio, the server's floor: pgbench in pipeline mode with prepared statements, BEGIN, the claim, the business write, COMMIT against the same without the claim, in the same rounds")
	flag.StringVar(&o.pgbench, "pgbench", "", "pgbench for -floor (default: the PATH's, else the newest /usr/lib/postgresql/*/bin/pgbench)")
	var batch string
	flag.StringVar(&batch, "batch", "100", "comma-separated batch sizes: modes batchN-bare (one transaction per batch, no inbox), batchN-inbox (inbox.BatchConsumer) and batchN-dup (batches of duplicates); empty for none")
	flag.IntVar(&o.kafka, "kafka", 0, "also run bare and inbox end to end through an in-process Kafka broker, this many messages per run (0: skip)")
	flag.Parse()
	for _, s := range strings.Split(conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "inbox-bench: -c: %q is not a positive number\n", s)
			os.Exit(2)
		}
		o.conc = append(o.conc, n)
	}
	for _, s := range strings.Split(batch, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "inbox-bench: -batch: %q is not a positive number\n", s)
			os.Exit(2)
		}
		o.batch = append(o.batch, n)
	}
	o.out = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "inbox-bench:", err)
		os.Exit(1)
	}
}

func env(def string, keys ...string) string {
	for _, k := range keys {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return def
}

func driverNames() string {
	names := make([]string, len(bench.Drivers))
	for i, d := range bench.Drivers {
		names[i] = d.Name
	}
	return strings.Join(names, ", ")
}

// The partitioned prefill spreads its claims over prefillDays days before
// today, and has the purge create the current partition and prefillAhead
// more, as a purge running daily keeps them.
const (
	prefillDays  = 14
	prefillAhead = 3
)

// mode is one way of handling the stream of messages: one at a time
// through h, or in batches of size through batch.
type mode struct {
	name  string
	h     message.HandlerFunc
	batch bench.BatchHandler
	size  int
	msgs  bench.Messages
	rt    *bench.RoundTrips // the round trips of its connections, when not the driver's
}

// run measures m with c workers for d.
func (m mode) run(ctx context.Context, c int, d time.Duration) bench.Result {
	if m.batch != nil {
		return bench.RunBatch(ctx, m.batch, c, m.size, d, m.msgs)
	}
	return bench.Run(ctx, m.h, c, d, m.msgs)
}

// batchModes are the batch modes of every size of o.batch, on conn.
func batchModes(o options, conn bench.Conn, c sqlinbox.Config, w bench.Write, fresh func() bench.Messages, dups bench.Messages) ([]mode, error) {
	bc, ok := conn.(bench.BatchConn)
	if !ok || len(o.batch) == 0 {
		return nil, nil
	}
	inboxB, err := bc.InboxBatch(c, w)
	if err != nil {
		return nil, err
	}
	var modes []mode
	for _, n := range o.batch {
		modes = append(modes,
			mode{name: fmt.Sprintf("batch%d-bare", n), batch: bc.BareBatch(w), size: n, msgs: fresh()},
			mode{name: fmt.Sprintf("batch%d-inbox", n), batch: inboxB, size: n, msgs: fresh()},
			mode{name: fmt.Sprintf("batch%d-dup", n), batch: inboxB, size: n, msgs: dups})
	}
	return modes, nil
}

// pooledSuffix names the modes that run through -pooler.
const pooledSuffix = "-pooled"

func run(ctx context.Context, o options) error {
	if o.parts {
		return claimParts(ctx, o)
	}
	drivers, err := bench.FindDrivers(o.drivers)
	if err != nil {
		return err
	}
	if o.sqlite == "" {
		dir, err := os.MkdirTemp("", "inbox-bench")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.sqlite = filepath.Join(dir, "bench.db")
	}
	if o.write == "" {
		o.write = "one-row"
	}
	if !slices.Contains(bench.WriteKinds, o.write) {
		return fmt.Errorf("-write: %q is not one of %s", o.write, strings.Join(bench.WriteKinds, ", "))
	}
	network := "direct"
	var lat *bench.Latency
	if o.rtt > 0 {
		network = fmt.Sprintf("+%s round trip through an in-process delay proxy", o.rtt)
		if lat, err = bench.NewLatency(o.rtt); err != nil {
			return err
		}
		defer lat.Close()
	}
	fmt.Fprintf(o.out, "inbox-bench: %s, GOMAXPROCS=%d, %d rounds of %s per mode, business write: %s: %s, network: %s\n",
		time.Now().Format(time.DateTime), runtime.GOMAXPROCS(0), o.rounds, o.duration, o.write, bench.DescribeWrite(o.write), network)
	fmt.Fprintln(o.out, "dedup = watermill middleware.Deduplicator: in memory, not durable, drops the redelivery of a message whose handler failed")
	if o.floor && o.pgbench == "" && slices.ContainsFunc(drivers, func(d bench.Driver) bool { return d.Dialect() == "postgresql" }) {
		if o.pgbench, err = bench.FindPgbench(); err != nil {
			fmt.Fprintf(o.out, "floor: NOT MEASURED: %v; -floor=false silences this\n", err)
		}
	}
	if o.pgbench != "" {
		fmt.Fprintf(o.out, "floor = %s in pipeline mode, -M prepared, -c as c, one round trip per transaction, direct: BEGIN, claim, business write, COMMIT / the same without the claim\n", o.pgbench)
	}
	for _, d := range drivers {
		if err := runDriver(ctx, o, d, lat); err != nil {
			return fmt.Errorf("%s: %w", d.Name, err)
		}
	}
	return nil
}

func (o options) dsnFor(d bench.Driver) string {
	switch d.Dialect() {
	case "mysql":
		return o.mysqlDSN
	case "sqlite":
		return sqlinbox.SQLiteDSN(o.sqlite)
	}
	return o.dsn
}

// runDriver measures d; lat, when not nil, adds its round trip to every
// measured connection (not to the admin pool's setup and WAL readings).
func runDriver(ctx context.Context, o options, d bench.Driver, lat *bench.Latency) error {
	dsn := o.dsnFor(d)
	admin, err := bench.OpenAdmin(ctx, d, dsn)
	if err != nil {
		return err
	}
	defer admin.Close()
	full, fullConfig := "", sqlinbox.Config{}
	var fullDups bench.Messages
	if o.prefill > 0 {
		full = fmt.Sprintf("inbox_bench_prefill_%d", o.prefill)
		if o.prefillP == "daily" || o.prefillP == "monthly" {
			full = fmt.Sprintf("inbox_bench_prefill_%s_%d", o.prefillP, o.prefill)
		}
		if o.prefillT != "" {
			full = o.prefillT
		}
		last := time.Now()
		progress := func(done int64) {
			if time.Since(last) > 10*time.Second {
				fmt.Fprintf(o.out, "  %d rows\n", done)
				last = time.Now()
			}
		}
		if o.prefillK != "" && o.prefillK != "processed_at" && (o.prefillK != "event_time" || o.prefillP == "none" || o.prefillP == "") {
			return fmt.Errorf("-prefill-key %q: use processed_at, or event_time with -prefill-partitioning daily or monthly", o.prefillK)
		}
		switch o.prefillP {
		case "none", "":
			fmt.Fprintf(o.out, "\nprefilling %s on %s with %d claims (the table is kept for later runs)\n", full, d.Dialect(), o.prefill)
			err = admin.Prefill(ctx, full, o.prefill, progress)
		case "daily", "monthly":
			fullConfig.Partitioning = sqlinbox.Daily
			if o.prefillP == "monthly" {
				fullConfig.Partitioning = sqlinbox.Monthly
			}
			if o.prefillK == "event_time" {
				if o.prefillT == "" {
					full = fmt.Sprintf("inbox_bench_idtime_%s_%d", o.prefillP, o.prefill)
				}
				fullConfig.Table = full
				fmt.Fprintf(o.out, "\nprefilling %s on %s with %d claims, UUIDv7 ids, in %s partitions by event time over %d days back, %d partitions ahead (the table is kept for later runs)\n",
					full, d.Dialect(), o.prefill, o.prefillP, prefillDays, prefillAhead)
				var filledOn time.Time
				filledOn, err = admin.PrefillIDTime(ctx, fullConfig, o.prefill, prefillDays, prefillAhead, progress)
				fullConfig.PartitionKey, fullConfig.UUIDEventIDs = sqlinbox.EventIDTime, true
				fullDups = bench.PrefilledIDTimeDuplicates(o.prefill, filledOn, prefillDays)
				break
			}
			fmt.Fprintf(o.out, "\nprefilling %s on %s with %d claims in %s partitions over %d days back, %d partitions ahead (the table is kept for later runs)\n",
				full, d.Dialect(), o.prefill, o.prefillP, prefillDays, prefillAhead)
			err = admin.PrefillPartitioned(ctx, full, fullConfig.Partitioning, o.prefill, prefillDays, prefillAhead, progress)
		default:
			return fmt.Errorf("-prefill-partitioning: %q is not none, daily or monthly", o.prefillP)
		}
		fullConfig.Table = full
		if err != nil {
			return fmt.Errorf("prefilling %s: %w", full, err)
		}
		if fullDups == nil {
			fullDups = bench.PrefilledDuplicates(o.prefill)
		}
	}

	write, err := admin.CreateWrite(ctx, o.write, "inbox_bench")
	if err != nil {
		return err
	}
	empty := bench.Name("inbox_bench")
	defer func() { _ = admin.Drop(context.WithoutCancel(ctx), append(write.Tables(), empty)...) }()
	emptyConfig := sqlinbox.Config{Table: empty, UUIDEventIDs: o.uuidIDs}
	if err := admin.CreateInbox(ctx, emptyConfig); err != nil {
		return err
	}
	var rt bench.RoundTrips
	if lat != nil && !d.Embedded {
		rt.Through(lat)
	}
	// One connection more than messages in flight: the inbox leaves one
	// free (inbox.ClaimPool), and a pgxinbox.Store refuses a pool of one.
	conn, err := d.Open(ctx, dsn, slices.Max(o.conc)+1, &rt)
	if err != nil {
		return err
	}
	defer conn.Close()

	inboxH, err := conn.Inbox(emptyConfig, write)
	if err != nil {
		return err
	}
	dupIDs := make([]string, o.dupIDs)
	for i := range dupIDs {
		dupIDs[i] = watermill.NewUUID()
	}
	fresh := bench.NewMessages
	if o.v7IDs || o.prefillK == "event_time" {
		fresh = bench.NewTimeOrderedMessages
	}
	dedup := &middleware.Deduplicator{KeyFactory: middleware.MessageHasher(inbox.DefaultEventID)}
	modes := []mode{
		{name: "bare", h: conn.Bare(write), msgs: fresh()},
		{name: "inbox", h: inboxH, msgs: fresh()},
		{name: "dup", h: inboxH, msgs: bench.Duplicates(dupIDs)},
		{name: "dedup", h: dedup.Middleware(conn.Bare(write)), msgs: fresh()},
	}
	batches, err := batchModes(o, conn, emptyConfig, write, fresh, bench.Duplicates(dupIDs))
	if err != nil {
		return err
	}
	modes = append(modes, batches...)
	if o.pooler != "" && d.Dialect() == "postgresql" {
		pooled, rt, err := openPooled(ctx, o, d, lat)
		if err != nil {
			return err
		}
		defer pooled.Close()
		pooledConfig := emptyConfig
		pooledConfig.TransactionPooling = true
		pooledH, err := pooled.Inbox(pooledConfig, write)
		if err != nil {
			return err
		}
		modes = append(modes,
			mode{name: "bare" + pooledSuffix, h: pooled.Bare(write), msgs: fresh(), rt: rt},
			mode{name: "inbox" + pooledSuffix, h: pooledH, msgs: fresh(), rt: rt})
	}
	if full != "" {
		fullH, err := conn.Inbox(fullConfig, write)
		if err != nil {
			return err
		}
		modes = append(modes,
			mode{name: "inbox-full", h: fullH, msgs: fresh()},
			mode{name: "dup-full", h: fullH, msgs: fullDups})
	}
	modes, err = selectModes(modes, o.modes)
	if err != nil {
		return err
	}
	reset := func() error {
		if err := admin.ResetWrite(ctx, write); err != nil {
			return err
		}
		if err := admin.Truncate(ctx, empty); err != nil {
			return err
		}
		i := 0
		return bench.RunN(inboxH, len(dupIDs), func(int) *message.Message {
			i++
			return message.NewMessage(dupIDs[i-1], nil)
		})
	}
	if err := reset(); err != nil {
		return err
	}

	var floor *bench.Floor
	if o.floor && d.Dialect() == "postgresql" && o.pgbench != "" {
		if floor, err = admin.NewFloor(ctx, o.pgbench, dsn, sqlinbox.Config{UUIDEventIDs: o.uuidIDs}, o.write); err != nil {
			return fmt.Errorf("the floor: %w", err)
		}
		defer func() { _ = floor.Close(context.WithoutCancel(ctx)) }()
	}

	fmt.Fprintf(o.out, "\n== %s\n", d.Name)
	tables := append(write.Tables(), empty)
	if full != "" {
		tables = append(tables, full)
	}
	if err := costs(ctx, o, admin, d, &rt, modes, tables); err != nil {
		return err
	}
	for _, c := range o.conc {
		if err := reset(); err != nil {
			return err
		}
		if floor != nil {
			if err := floor.Reset(ctx); err != nil {
				return err
			}
		}
		if err := throughput(ctx, o, d, c, modes, floor); err != nil {
			return err
		}
	}
	if o.kafka > 0 {
		// New events only: duplicates and the Deduplicator say nothing
		// more end to end.
		km, err := selectModes(modes, "bare,inbox")
		if err != nil {
			return fmt.Errorf("-kafka compares the bare and inbox modes: %w", err)
		}
		return kafkaEndToEnd(ctx, o, km)
	}
	return nil
}

// openPooled opens d through o.pooler, with the DSN setting a
// transaction-pooling proxy needs for d (lib/pq binary_parameters=yes, pgx
// default_query_exec_mode=exec), counting its round trips apart.
func openPooled(ctx context.Context, o options, d bench.Driver, lat *bench.Latency) (bench.Conn, *bench.RoundTrips, error) {
	driver := "pgx"
	if strings.HasSuffix(d.Name, "/lib-pq") {
		driver = "postgres"
	}
	rt := &bench.RoundTrips{}
	if lat != nil {
		rt.Through(lat)
	}
	conn, err := d.Open(ctx, testdb.PoolerSettings(o.pooler, driver), slices.Max(o.conc), rt)
	if err != nil {
		return nil, nil, fmt.Errorf("through -pooler: %w", err)
	}
	return conn, rt, nil
}

// claimParts prints the WAL of one claim in tables holding more and more of
// the inbox row, to show what a cheaper claim could save.
func claimParts(ctx context.Context, o options) error {
	pg, err := bench.FindDrivers("postgresql/pgx")
	if err != nil {
		return err
	}
	admin, err := bench.OpenAdmin(ctx, pg[0], o.dsn)
	if err != nil {
		return err
	}
	defer admin.Close()
	parts, err := admin.ClaimParts(ctx, o.sample)
	if err != nil {
		return err
	}
	var commit []float64
	for _, p := range parts {
		commit = append(commit, p.Commit)
	}
	fmt.Fprintf(o.out, "inbox-bench: %s, the parts of a claim: PostgreSQL WAL bytes per claim, %d claims per table, one per transaction,\n",
		time.Now().Format(time.DateTime), o.sample)
	fmt.Fprintf(o.out, "without full-page images and without the commit record, which a claim shares with the business write: %.0f bytes\n", median(commit))
	tw := tabwriter.NewWriter(o.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "part\ttext ids\tadds\tuuid ids\tadds\t")
	half := len(parts) / 2 // text ids first, then the same parts with uuid ids
	for i, p := range parts[:half] {
		u := parts[half+i]
		addT, addU := "", ""
		if i > 0 && !strings.HasPrefix(p.Part, " ") && !strings.HasPrefix(p.Part, "the inbox") {
			addT, addU = fmt.Sprintf("%+.0f", p.Bytes-parts[i-1].Bytes), fmt.Sprintf("%+.0f", u.Bytes-parts[half+i-1].Bytes)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.0f\t%s\t\n", p.Part, p.Bytes, addT, u.Bytes, addU)
	}
	return tw.Flush()
}

func selectModes(all []mode, list string) ([]mode, error) {
	if list == "all" {
		return all, nil
	}
	var out []mode
	for _, name := range strings.Split(list, ",") {
		i := slices.IndexFunc(all, func(m mode) bool { return m.name == name })
		if i < 0 {
			return nil, fmt.Errorf("unknown or unavailable mode %q", name)
		}
		out = append(out, all[i])
	}
	if out[0].name != "bare" {
		return nil, errors.New("-modes must start with bare, the baseline of every ratio")
	}
	return out, nil
}

// costs measures one message at a time, in three samples: round trips and
// allocations are exact averages of the smallest sample (the lease's
// heartbeat adds up to 3 round trips to a sample every 20 s, GC and other
// goroutines add allocations). WAL, on PostgreSQL with pg_walinspect,
// counts only the records of the benchmark's transactions, with full-page
// images (written for the first change to a page after each checkpoint, so
// they depend on the checkpoint rhythm) apart; without it, it is the
// smallest sample of everything the server wrote.
func costs(ctx context.Context, o options, admin *bench.Admin, d bench.Driver, rt *bench.RoundTrips, modes []mode, tables []string) error {
	wal := admin.WAL(ctx)
	tw := tabwriter.NewWriter(o.out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "one at a time\tround trips/msg\tWAL bytes/msg\tfull-page image bytes/msg\tallocs/msg\t")
	for _, m := range modes {
		if m.batch != nil { // one at a time is the per-message modes' measure
			continue
		}
		if err := bench.RunN(m.h, min(o.sample, 50), m.msgs); err != nil { // warm: prepare statements
			return fmt.Errorf("%s: %w", m.name, err)
		}
		trips, allocs := -1.0, -1.0
		var records, fpi []float64
		exact := false
		// Three samples; one whose WAL could not be read is taken again.
		for s, lost := 0, 0; s < 3+lost; s++ {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			mallocs := ms.Mallocs
			var from, to bench.WALMark
			var err error
			if wal != nil {
				if from, err = wal.Mark(ctx); err != nil {
					return err
				}
			}
			mrt := rt
			if m.rt != nil {
				mrt = m.rt
			}
			rt0 := mrt.Count()
			if err := bench.RunN(m.h, o.sample, m.msgs); err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			rt1 := mrt.Count()
			runtime.ReadMemStats(&ms)
			n := float64(o.sample)
			if r := float64(rt1-rt0) / n; trips < 0 || r < trips {
				trips = r
			}
			if a := float64(ms.Mallocs-mallocs) / n; allocs < 0 || a < allocs {
				allocs = a
			}
			if wal != nil {
				if to, err = wal.Mark(ctx); err != nil {
					return err
				}
				r, f, ok, err := wal.Between(ctx, from, to, tables...)
				if errors.Is(err, bench.ErrWALUnreadable) && lost < 3 {
					lost++
					continue
				}
				if err != nil {
					return fmt.Errorf("measuring WAL: %w", err)
				}
				exact = ok
				records, fpi = append(records, float64(r)/n), append(fpi, float64(f)/n)
			}
		}
		tripsCol, walCol, fpiCol := fmt.Sprintf("%.2f", trips), "-", "-"
		if d.Embedded {
			tripsCol = "-"
		}
		switch {
		case exact:
			walCol, fpiCol = fmt.Sprintf("%.0f", mean(records)), fmt.Sprintf("%.0f", mean(fpi))
		case wal != nil:
			walCol = fmt.Sprintf("%.0f (server-wide)", slices.Min(records))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.0f\t\n", m.name, tripsCol, walCol, fpiCol, allocs)
	}
	return tw.Flush()
}

func mean(xs []float64) float64 {
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// throughput measures modes at concurrency c in interleaved rounds, and
// floor, when not nil, in the same rounds.
func throughput(ctx context.Context, o options, d bench.Driver, c int, modes []mode, floor *bench.Floor) error {
	for _, m := range modes { // warm every connection of the pool
		if r := m.run(ctx, c, min(o.duration, 200*time.Millisecond)); r.FirstErr != nil {
			return fmt.Errorf("%s: %w", m.name, r.FirstErr)
		}
	}
	results := make([]bench.Result, len(modes))
	ratios := make([][]float64, len(modes))
	var floors []float64
	for round := range o.rounds {
		if floor != nil {
			f, err := floorRound(ctx, floor, c, o.duration, round%2 == 1)
			if err != nil {
				return fmt.Errorf("the floor: %w", err)
			}
			floors = append(floors, f)
		}
		order := make([]int, len(modes))
		for i := range order {
			order[i] = i
		}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		rates := make([]float64, len(modes))
		for _, i := range order {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r := modes[i].run(ctx, c, o.duration)
			rates[i] = r.Rate()
			results[i] = results[i].Merge(r)
		}
		for i := range modes {
			ratios[i] = append(ratios[i], rates[i]/rates[0])
		}
	}
	tw := tabwriter.NewWriter(o.out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "c=%d\tmsgs/s\tp50\tp99\tratio\terrors\t\n", c)
	for i, m := range modes {
		r := results[i]
		errs := ""
		if r.Errors > 0 {
			errs = fmt.Sprintf("%d (%v)", r.Errors, r.FirstErr)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%.2f\t%s\t\n", m.name, r.Rate(), ms(r.Percentile(0.5)), ms(r.Percentile(0.99)), median(ratios[i]), errs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// Through the pooler against direct, mode by mode, from the rates of
	// each round (ratios[i] are to the same round's bare).
	for i, m := range modes {
		direct := slices.IndexFunc(modes, func(d mode) bool { return d.name+pooledSuffix == m.name })
		if direct < 0 {
			continue
		}
		var per []float64
		for r := range ratios[i] {
			per = append(per, ratios[i][r]/ratios[direct][r])
		}
		fmt.Fprintf(o.out, "%s / %s: %.2f, rounds %.2f to %.2f\n", m.name, modes[direct].name, median(per), slices.Min(per), slices.Max(per))
	}
	inboxMode := slices.IndexFunc(modes, func(m mode) bool { return m.name == "inbox" })
	batchRatios(o.out, d, c, modes, ratios, inboxMode)
	switch {
	case d.Dialect() != "postgresql" || !o.floor || inboxMode < 0:
	case floor == nil:
		fmt.Fprintf(o.out, "%s c=%d: inbox %.2f of bare; floor NOT MEASURED: no pgbench\n", d.Name, c, median(ratios[inboxMode]))
	default:
		in := ratios[inboxMode]
		fmt.Fprintf(o.out, "%s c=%d: inbox %.2f of bare, rounds %.2f to %.2f; floor %.2f, rounds %.2f to %.2f; inbox - floor %+.2f\n",
			d.Name, c, median(in), slices.Min(in), slices.Max(in), median(floors), slices.Min(floors), slices.Max(floors), median(in)-median(floors))
	}
	return nil
}

// floorRound runs the floor's two scripts for d each, the claim's first
// when claimFirst, and returns the claim's rate over the bare one's.
func floorRound(ctx context.Context, f *bench.Floor, c int, d time.Duration, claimFirst bool) (float64, error) {
	var tps [2]float64 // bare, claim
	for _, withClaim := range []bool{claimFirst, !claimFirst} {
		t, err := f.Run(ctx, withClaim, c, d)
		if err != nil {
			return 0, err
		}
		if withClaim {
			tps[1] = t
		} else {
			tps[0] = t
		}
	}
	return tps[1] / tps[0], nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// batchRatios prints, per batch size, the batch inbox's rate over the
// per-message inbox's and over the bare batch's, from the rates of each
// round (ratios[i] are to the same round's bare).
func batchRatios(out io.Writer, d bench.Driver, c int, modes []mode, ratios [][]float64, inboxMode int) {
	index := func(name string) int { return slices.IndexFunc(modes, func(m mode) bool { return m.name == name }) }
	over := func(a, b int) string {
		var per []float64
		for r := range ratios[a] {
			per = append(per, ratios[a][r]/ratios[b][r])
		}
		return fmt.Sprintf("%.2f, rounds %.2f to %.2f", median(per), slices.Min(per), slices.Max(per))
	}
	for _, m := range modes {
		if m.batch == nil || !strings.HasSuffix(m.name, "-inbox") {
			continue
		}
		line := fmt.Sprintf("%s c=%d: %s", d.Name, c, m.name)
		if inboxMode >= 0 {
			line += " / inbox " + over(index(m.name), inboxMode) + ";"
		}
		if bare := index(strings.TrimSuffix(m.name, "-inbox") + "-bare"); bare >= 0 {
			line += fmt.Sprintf(" / %s %s", modes[bare].name, over(index(m.name), bare))
		}
		fmt.Fprintln(out, line)
	}
}
