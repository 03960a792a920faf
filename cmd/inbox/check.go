package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/watermill-inbox/inbox/internal/clock"
	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/purge"
)

// remedies say what to do about a failed finding, per aspect.
var remedies = map[string]string{
	maintenance.AspectLayout:      "-partitioning and -partition-key must describe the table as created; a partitioned table claimed as a plain one lets duplicates through",
	maintenance.AspectColumns:     "the table was made for another configuration (-uuid-event-ids), or is not an inbox table: check -table and the flags",
	maintenance.AspectFingerprint: "add the column: inbox schema -add-fingerprint-column -apply (or its printed statement in a migration)",
	maintenance.AspectPrimaryKey:  "the inbox detects duplicates by this key: recreate the table from inbox schema",
	maintenance.AspectIndex:       "the purge and the oldest-claim metric scan the table without it: create it (inbox schema prints it)",
	maintenance.AspectPartitions:  "run inbox purge (it creates the partitions ahead), or inbox schema -apply",
}

// blockedRemedy replaces the partitions' remedy when rows in the default
// partition block a period: the purge cannot create its partition.
const blockedRemedy = "run inbox schema -apply with the same flags: it creates the missing partitions and moves the rows that block them out of the default partition (claims wait for the move); inbox purge cannot"

// runCheck checks a deployment: the database answers, the table matches the
// configuration, and the purge retention outlives the broker's.
func runCheck(ctx context.Context, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	setUsage(fs, stderr,
		"usage: inbox check -dsn DSN [flags] [-retention D -broker-retention D]",
		"Exit status: 0 every check passed, 1 a check failed, 2 invalid flags, 3 cannot connect.",
	)
	db := addDatabaseFlags(fs)
	ret := addRetentionFlags(fs)
	var broker durationFlag
	slack := durationFlag{d: 24 * time.Hour}
	fs.Var(&broker, "broker-retention", "how long the broker can still deliver a message, e.g. 7d: Kafka retention.ms plus segment.ms, JetStream the stream's MaxAge, RabbitMQ the queue's message TTL, Redis the oldest entry kept (docs/retention.md#broker-retention)")
	fs.Var(&slack, "slack", "how long after the broker's retention a copy can still arrive: retries, messages republished from a poison queue")
	ahead := fs.Int("partitions-ahead", purge.DefaultPartitionsAhead, "partitioned tables: future partitions that must exist")
	if err := parse(fs, args); err != nil {
		return err
	}
	if (ret.retention.d == 0) != (broker.d == 0) {
		return usage("give both -retention and -broker-retention to check the purge retention, or neither")
	}
	if len(ret.perConsumer) > 0 && ret.retention.d == 0 {
		return usage("-consumer-retention needs -retention and -broker-retention")
	}
	if *ahead < 0 {
		return usage("-partitions-ahead is negative")
	}
	store, sqlDB, err := db.connect(ctx, false)
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	fmt.Fprintf(stdout, "ok    connection: the %s database answers\n", db.dialect)

	c, err := store.Maintenance().Check(ctx, *ahead)
	if err != nil {
		return err
	}
	failed := 0
	if !c.Exists {
		failed++
		fmt.Fprintf(stdout, "FAIL  table: %s does not exist\n      %s\n", store.Table(), createIt)
	} else {
		fmt.Fprintf(stdout, "ok    table: %s exists\n", store.Table())
		failed += printFindings(stdout, c.Findings)
		if leases, err := store.Maintenance().Leases(ctx); errors.Is(err, maintenance.ErrNoLeaseTable) {
			failed++
			fmt.Fprintf(stdout, "FAIL  consumers: %v\n", err)
		} else if err != nil {
			// A user granted the inbox table only: the rest still checks.
			fmt.Fprintf(stdout, "-     consumers: not checked: %v\n", err)
		} else {
			failed += printLeases(stdout, leases)
		}
	}
	failed += checkRetention(stdout, ret, broker.d, slack.d)
	if failed > 0 {
		return fmt.Errorf("%s failed", count(failed, "check"))
	}
	if broker.d == 0 {
		fmt.Fprintln(stdout, "every check passed, but the purge retention was not checked: give -retention and -broker-retention to check it")
	} else {
		fmt.Fprintln(stdout, "every check passed")
	}
	return nil
}

// createIt says how to create a missing table.
const createIt = "create it with inbox schema -apply, or apply the DDL of inbox schema with your migration tool; or check -table and -dsn"

// printFindings prints one line per finding, with what to do for a failed
// one, and returns how many failed.
func printFindings(w io.Writer, findings []maintenance.Finding) int {
	failed := 0
	for _, f := range findings {
		remedy := remedies[f.Aspect]
		if len(f.Blocked) > 0 {
			remedy = blockedRemedy
		}
		switch {
		case f.Warning != "":
			fmt.Fprintf(w, "warn  %s: %s\n      %s\n", f.Aspect, f.Found, f.Warning)
		case f.OK:
			fmt.Fprintf(w, "ok    %s: %s\n", f.Aspect, f.Found)
		default:
			failed++
			fmt.Fprintf(w, "FAIL  %s: %s, want %s\n", f.Aspect, f.Found, f.Want)
		}
		for _, b := range f.Blocked {
			fmt.Fprintf(w, "      %s\n", blockedLine(b))
		}
		if !f.OK || len(f.Blocked) > 0 {
			fmt.Fprintf(w, "      %s\n", remedy)
		}
	}
	return failed
}

// blockedLine says why a period has no partition, and where its rows come
// from: times ahead of the clock are events dated in the future.
func blockedLine(b maintenance.BlockedPeriod) string {
	why := "claims made while no partition covered it"
	if b.Last.After(clock.Now()) {
		why = "dated ahead of the clock: events with a time in the future"
	}
	span := b.First.Format(timeLayout)
	if !b.Last.Equal(b.First) {
		span += " to " + b.Last.Format(timeLayout)
	}
	return fmt.Sprintf("%s cannot be created: the default partition holds %s of its period (%s UTC, %s)", b.Name, count(int(b.Rows), "row"), span, why)
}

// checkRetention refuses a purge retention under the broker's retention
// plus slack: a copy of an event replayed from the broker would find its
// claim purged and be processed again. Without the flags it says it did
// not check.
func checkRetention(w io.Writer, ret *retentionFlags, broker, slack time.Duration) int {
	if broker == 0 {
		fmt.Fprintln(w, "-     retention: not checked (give -retention and -broker-retention)")
		return 0
	}
	need := broker + slack
	type retention struct {
		name string
		d    time.Duration
	}
	all := []retention{{"-retention", ret.retention.d}}
	for _, c := range slices.Sorted(maps.Keys(ret.perConsumer)) {
		all = append(all, retention{fmt.Sprintf("-consumer-retention %s", c), ret.perConsumer[c]})
	}
	failed := 0
	for _, r := range all {
		if r.d >= need {
			fmt.Fprintf(w, "ok    retention: %s %s outlives the broker's %s plus %s of slack\n", r.name, days(r.d), days(broker), days(slack))
			continue
		}
		failed++
		fmt.Fprintf(w, "FAIL  retention: %s %s is shorter than the broker's %s plus %s of slack: an event replayed from the broker could find its claim purged and be processed again\n      keep claims at least %s (the purge's retention too)\n",
			r.name, days(r.d), days(broker), days(slack), days(need))
	}
	return failed
}
