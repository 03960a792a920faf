package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/purge"
)

// runPurge removes expired rows, once (for cron or a Kubernetes CronJob) or
// in a loop. It refuses retentions below a day unless
// -allow-short-retention is given; -dry-run prints per consumer what a
// purge would remove. A round run once shows its progress when stderr is a
// terminal.
func runPurge(ctx context.Context, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	setUsage(fs, stderr,
		"usage: inbox purge -dsn DSN -retention D [flags]",
		"Exit status: 0 purged (or another instance is purging), 1 failed, 2 invalid flags, 3 cannot connect.",
		`stdout's last line starts with "removed" when the round ran, "skipped:" when another instance holds the purge lock (with its holder and, where the database tells, for how long).`,
	)
	db := addDatabaseFlags(fs)
	ret := addRetentionFlags(fs)
	var (
		minRetention = durationFlag{d: purge.DefaultMinRetention}
		allowShort   = fs.Bool("allow-short-retention", false, "accept a retention below -min-retention")
		batch        = fs.Int("batch", 0, fmt.Sprintf("most rows one DELETE removes, %d to %d (default %d, on SQLite %d)", purge.MinBatchSize, purge.MaxBatchSize, purge.DefaultBatchSize, purge.DefaultSQLiteBatchSize))
		timeout      = fs.Duration("statement-timeout", purge.DefaultStatementTimeout, "time limit of one DELETE; a timeout halves the batch")
		ahead        = fs.Int("partitions-ahead", purge.DefaultPartitionsAhead, "future partitions to keep ready (partitioned tables)")
		loop         = fs.Bool("loop", false, "purge every -interval until interrupted, instead of once")
		interval     = fs.Duration("interval", purge.DefaultInterval, "time between purges with -loop")
		dryRun       = fs.Bool("dry-run", false, "print per consumer how many rows would be removed, remove nothing")
		verbose      = fs.Bool("v", false, "log debug details")
		showProgress = fs.Bool("progress", isTerminal(stderr), "show the progress of a round run once (default: when stderr is a terminal)")
	)
	fs.Bool("once", true, "purge once and exit (the default; see -loop)")
	fs.Var(&minRetention, "min-retention", "refuse retentions below this")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *loop && *dryRun {
		return usage("-dry-run and -loop exclude each other")
	}
	if err := refuseZeros(fs, zeroPurgeFlags); err != nil {
		return err
	}
	store, sqlDB, err := db.store()
	if err != nil {
		return err
	}
	_ = sqlDB.Close()
	var bar *progress
	logOut := stderr
	if *showProgress && !*loop && !*dryRun {
		bar = &progress{w: stderr, table: store.Table()}
		logOut = bar // a log line ends the progress line first
	}
	config := purge.Config{
		Retention:           ret.retention.d,
		ConsumerRetention:   ret.perConsumer,
		MinRetention:        minRetention.d,
		AllowShortRetention: *allowShort,
		BatchSize:           *batch,
		StatementTimeout:    *timeout,
		Interval:            *interval,
		PartitionsAhead:     *ahead,
		Logger:              watermill.NewStdLoggerWithOut(logOut, *verbose, false),
	}
	if bar != nil {
		config.OnBatch = bar.batch
	}
	// Invalid flags are refused before anything connects.
	if err := checkPurgeFlags(config, store.Maintenance(), db.partitioning); err != nil {
		return err
	}
	if _, err := purge.New(store, config); err != nil {
		return usage("%v", err)
	}
	store, sqlDB, err = db.connectTable(ctx)
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	p, err := purge.New(store, config)
	if err != nil {
		return usage("%v", err)
	}
	const needs = "DELETE (on a partitioned table also CREATE, and ownership to drop partitions)"

	switch {
	case *dryRun || bar != nil:
		if bar != nil {
			bar.counting()
		}
		counts, err := p.DryRun(ctx)
		if errors.Is(err, purge.ErrSkipped) {
			printSkipped(stdout, store.Table(), err)
			return nil
		}
		if err != nil {
			return err
		}
		var total int64
		for _, c := range slices.Sorted(maps.Keys(counts)) {
			if *dryRun {
				fmt.Fprintf(stdout, "%s\t%d\n", c, counts[c])
			}
			total += counts[c]
		}
		if *dryRun {
			fmt.Fprintf(stdout, "would remove %d rows from %s\n", total, store.Table())
			return nil
		}
		bar.start(total)
	case *loop:
		if err := p.Run(ctx); err != nil {
			return err
		}
		return nil
	}
	start := time.Now()
	n, err := p.PurgeOnce(ctx)
	bar.finish()
	if errors.Is(err, purge.ErrSkipped) {
		printSkipped(stdout, store.Table(), err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("removed %d rows, then failed: %w", n, explain(err, store.Table(), needs))
	}
	fmt.Fprintf(stdout, "removed %d rows from %s in %s\n", n, store.Table(), time.Since(start).Round(time.Millisecond))
	return nil
}

// zeroPurgeFlags say why each flag of inbox purge refuses zero, which
// purge.Config would read as its default.
var zeroPurgeFlags = map[string]string{
	"batch":             fmt.Sprintf("a batch of no rows purges nothing; give %d to %d (default %d, on SQLite %d)", purge.MinBatchSize, purge.MaxBatchSize, purge.DefaultBatchSize, purge.DefaultSQLiteBatchSize),
	"min-retention":     "a floor of zero would let any retention through; to purge below the floor, give -allow-short-retention",
	"statement-timeout": "a DELETE needs a time limit; give a positive duration (default " + purge.DefaultStatementTimeout.String() + ")",
	"interval":          "rounds back to back would never pause; give a positive duration (default " + purge.DefaultInterval.String() + ")",
	"partitions-ahead":  fmt.Sprintf("a round keeps at least the next partition ready; give 1 or more (default %d)", purge.DefaultPartitionsAhead),
}

// refuseZeros refuses a flag of reasons set to zero on the command line,
// with its reason.
func refuseZeros(fs *flag.FlagSet, reasons map[string]string) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if reason, ok := reasons[f.Name]; ok && err == nil && (f.Value.String() == "0" || f.Value.String() == "0s") {
			err = usage("-%s %s: %s", f.Name, f.Value, reason)
		}
	})
	return err
}

// printSkipped prints a round skipped because another instance holds the
// purge lock, on a line of its own that starts with "skipped:" (a purged
// round's starts with "removed"), with what the database tells of the
// holder: a lock held for hours is a stuck round, not one under way.
func printSkipped(stdout io.Writer, table string, err error) {
	holder := strings.TrimPrefix(strings.TrimPrefix(err.Error(), purge.ErrSkipped.Error()), ": ")
	if holder == "" {
		holder = "another instance holds the purge lock"
	}
	fmt.Fprintf(stdout, "skipped: another purge of %s is running; %s\n", table, holder)
}
