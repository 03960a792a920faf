// Command inbox-purge removes expired rows from an inbox table, once (for
// cron or a Kubernetes CronJob) or in a loop. It refuses retentions below a
// day unless -allow-short-retention is given, and -dry-run prints per
// consumer what a purge would remove.
//
//	inbox-purge -dsn "$DATABASE_URL" -retention 14d
//	inbox-purge -dialect mysql -dsn 'user:pw@tcp(db:3306)/app' -table app_inbox -retention 14d -dry-run
//	inbox-purge -dsn "$DATABASE_URL" -retention 30d -partitioning daily -loop -interval 1h
//	inbox-purge -dialect sqlite -dsn app.db -retention 14d
//
// Exit status: 0 when the purge ran or another instance was already purging
// the table (it is doing the work), 1 when the purge failed, 2 for invalid
// flags or configuration.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Exit statuses.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// dialects maps -dialect to the dialect and the database/sql driver name.
var dialects = map[string]struct {
	dialect sqlinbox.Dialect
	driver  string
}{
	"postgresql": {sqlinbox.PostgreSQL, "pgx"},
	"mysql":      {sqlinbox.MySQL, "mysql"},
	"sqlite":     {sqlinbox.SQLite, "sqlite"},
}

var partitionings = map[string]sqlinbox.Partitioning{
	"none":    sqlinbox.NoPartitioning,
	"daily":   sqlinbox.Daily,
	"monthly": sqlinbox.Monthly,
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("inbox-purge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		dsn          = fs.String("dsn", "", fmt.Sprintf("database connection string (required); a SQLite file or DSN waits %s for the write lock unless it sets busy_timeout", sqlinbox.DefaultSQLiteBusyTimeout))
		dialectName  = fs.String("dialect", "postgresql", "postgresql, mysql or sqlite")
		table        = fs.String("table", sqlinbox.DefaultTable, "inbox table, optionally schema.table")
		partitioning = fs.String("partitioning", "none", "the table's layout on PostgreSQL: none, daily or monthly (as created)")
		retention    = durationFlag{}
		perConsumer  = consumerRetention{}
		minRetention = durationFlag{d: purge.DefaultMinRetention}
		allowShort   = fs.Bool("allow-short-retention", false, "accept a retention below -min-retention")
		batch        = fs.Int("batch", purge.DefaultBatchSize, "most rows one DELETE removes")
		timeout      = fs.Duration("statement-timeout", purge.DefaultStatementTimeout, "time limit of one DELETE; a timeout halves the batch")
		ahead        = fs.Int("partitions-ahead", purge.DefaultPartitionsAhead, "future partitions to keep ready (partitioned tables)")
		loop         = fs.Bool("loop", false, "purge every -interval until interrupted, instead of once")
		interval     = fs.Duration("interval", purge.DefaultInterval, "time between purges with -loop")
		dryRun       = fs.Bool("dry-run", false, "print per consumer how many rows would be removed, remove nothing")
		verbose      = fs.Bool("v", false, "log debug details")
	)
	fs.Bool("once", true, "purge once and exit (the default; see -loop)")
	fs.Var(&retention, "retention", "keep rows this long after processing, e.g. 14d or 336h (required)")
	fs.Var(&perConsumer, "consumer-retention", "consumer=duration: another retention for one consumer (repeatable)")
	fs.Var(&minRetention, "min-retention", "refuse retentions below this")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "inbox-purge: "+format+"\n", a...)
		return exitUsage
	}
	if fs.NArg() > 0 {
		return usage("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *dsn == "" {
		return usage("-dsn is required")
	}
	d, ok := dialects[*dialectName]
	if !ok {
		return usage("-dialect %q: use postgresql, mysql or sqlite", *dialectName)
	}
	part, ok := partitionings[*partitioning]
	if !ok {
		return usage("-partitioning %q: use none, daily or monthly", *partitioning)
	}
	if *loop && *dryRun {
		return usage("-dry-run and -loop exclude each other")
	}

	if d.dialect == sqlinbox.SQLite {
		*dsn = sqliteBusyTimeout(*dsn)
	}
	db, err := sql.Open(d.driver, *dsn)
	if err != nil {
		return usage("-dsn: %v", err)
	}
	defer db.Close()
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: d.dialect, Table: *table, Partitioning: part})
	if err != nil {
		return usage("%v", err)
	}
	logger := watermill.NewStdLoggerWithOut(stderr, *verbose, false)
	p, err := purge.New(store, purge.Config{
		Retention:           retention.d,
		ConsumerRetention:   perConsumer,
		MinRetention:        minRetention.d,
		AllowShortRetention: *allowShort,
		BatchSize:           *batch,
		StatementTimeout:    *timeout,
		Interval:            *interval,
		PartitionsAhead:     *ahead,
		Logger:              logger,
	})
	if err != nil {
		return usage("%v", err)
	}

	switch {
	case *dryRun:
		counts, err := p.DryRun(ctx)
		if errors.Is(err, purge.ErrSkipped) {
			fmt.Fprintln(stdout, "another purge of this table is running; try again later")
			return exitOK
		}
		if err != nil {
			fmt.Fprintf(stderr, "inbox-purge: %v\n", err)
			return exitFailed
		}
		var total int64
		for _, c := range slices.Sorted(maps.Keys(counts)) {
			fmt.Fprintf(stdout, "%s\t%d\n", c, counts[c])
			total += counts[c]
		}
		fmt.Fprintf(stdout, "would remove %d rows from %s\n", total, store.Table())
		return exitOK
	case *loop:
		if err := p.Run(ctx); err != nil {
			fmt.Fprintf(stderr, "inbox-purge: %v\n", err)
			return exitFailed
		}
		return exitOK
	default:
		start := time.Now()
		n, err := p.PurgeOnce(ctx)
		if errors.Is(err, purge.ErrSkipped) {
			fmt.Fprintf(stdout, "another purge of %s is running; skipped\n", store.Table())
			return exitOK
		}
		if err != nil {
			fmt.Fprintf(stderr, "inbox-purge: removed %d rows, then failed: %v\n", n, err)
			return exitFailed
		}
		fmt.Fprintf(stdout, "removed %d rows from %s in %s\n", n, store.Table(), time.Since(start).Round(time.Millisecond))
		return exitOK
	}
}

// durationFlag is a time.Duration that also accepts whole days ("14d"),
// the unit retentions are thought in.
type durationFlag struct{ d time.Duration }

func (f *durationFlag) String() string { return f.d.String() }

func (f *durationFlag) Set(s string) error {
	d, err := parseDuration(s)
	f.d = d
	return err
}

// maxDays is the most whole days a time.Duration holds (about 292 years):
// more would wrap around, 213504d to 25 minutes.
const maxDays = int64(math.MaxInt64 / (24 * time.Hour))

func parseDuration(s string) (time.Duration, error) {
	negative := fmt.Errorf("%q: a duration cannot be negative", s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		// Out of range, ParseInt returns the extreme of the right sign.
		n, err := strconv.ParseInt(days, 10, 64)
		switch {
		case err != nil && !errors.Is(err, strconv.ErrRange):
			return 0, fmt.Errorf("%q: want whole days (14d) or a Go duration (336h)", s)
		case n < 0:
			return 0, negative
		case n > maxDays:
			return 0, fmt.Errorf("%q: at most %dd (about 292 years)", s, maxDays)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s) // refuses overflows itself
	if err != nil {
		return 0, err
	}
	if d < 0 {
		return 0, negative
	}
	return d, nil
}

// consumerRetention collects repeated -consumer-retention consumer=duration.
type consumerRetention map[string]time.Duration

func (c consumerRetention) String() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(c)) {
		parts = append(parts, k+"="+c[k].String())
	}
	return strings.Join(parts, ",")
}

func (c consumerRetention) Set(s string) error {
	consumer, value, ok := strings.Cut(s, "=")
	if !ok || consumer == "" {
		return fmt.Errorf("%q: want consumer=duration", s)
	}
	d, err := parseDuration(value)
	if err != nil {
		return err
	}
	c[consumer] = d
	return nil
}
