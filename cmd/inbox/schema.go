package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// runSchema prints the DDL of the configured table, for goose, atlas,
// golang-migrate or psql, or applies it with -apply. Applying leaves a table
// that matches the configuration alone (so a read-only user may run it),
// adds the fingerprint column when the configuration wants it, creates the
// partitions ahead on a partitioned table, and fails on a table made for
// another configuration.
func runSchema(ctx context.Context, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	setUsage(fs, stderr,
		"usage: inbox schema [-dialect D] [-table T] [-partitioning P] [-uuid-event-ids] [-fingerprints] [-add-fingerprint-column] [-format F] [-down] [-apply -dsn DSN]",
		"Prints the DDL for the configuration (without -dsn), or applies it (-apply).",
		"  inbox schema -format goose > 00001_inbox.sql           # goose: Up and Down in one file",
		"  inbox schema > 000001_inbox.up.sql                     # golang-migrate, Atlas, psql: the plain script",
		"  inbox schema -down > 000001_inbox.down.sql             # and its down migration",
	)
	db := addDatabaseFlags(fs)
	apply := fs.Bool("apply", false, "apply the DDL to the database at -dsn instead of printing it")
	addColumn := fs.Bool("add-fingerprint-column", false, "only the statement that adds the fingerprint column to an existing table")
	ahead := fs.Int("partitions-ahead", purge.DefaultPartitionsAhead, "with -apply on a partitioned table: future partitions to create")
	format := fs.String("format", "plain", "what to print: plain (a script for psql, golang-migrate, Atlas), or goose (a goose migration, Up and Down)")
	down := fs.Bool("down", false, "print the statement that undoes the schema (drops the table and every claim), for a down migration")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *apply && (*down || *format != "plain") {
		return usage("-apply runs the DDL itself: -format and -down are for printing it")
	}
	if !*apply {
		store, sqlDB, err := db.store()
		if err != nil {
			return err
		}
		defer sqlDB.Close()
		up, drop := migrationStatements(store, *addColumn)
		out, err := migrationScript(*format, up, drop, *down)
		if err != nil {
			return err
		}
		fmt.Fprint(stdout, out)
		return nil
	}
	store, sqlDB, err := db.connect(ctx, true)
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	m := store.Maintenance()
	if *addColumn {
		added, err := m.AddFingerprintColumn(ctx)
		if err != nil {
			return explain(err, store.Table(), "ALTER")
		}
		if added {
			fmt.Fprintf(stdout, "added the fingerprint column to %s\n", store.Table())
		} else {
			fmt.Fprintf(stdout, "%s already has the fingerprint column\n", store.Table())
		}
		return nil
	}
	return applySchema(ctx, store, *ahead, stdout)
}

func applySchema(ctx context.Context, store *sqlinbox.Store, ahead int, stdout io.Writer) error {
	m := store.Maintenance()
	before, err := m.Check(ctx, ahead)
	if err != nil {
		return err
	}
	blocked := len(finding(before, maintenance.AspectPartitions).Blocked) > 0
	if before.OK() && !blocked {
		fmt.Fprintf(stdout, "%s already matches the configuration; nothing to do\n", store.Table())
		return nil
	}
	// Only a missing fingerprint column or missing partitions are added to
	// an existing table; anything else means another configuration.
	for _, f := range before.Findings {
		if !f.OK && f.Aspect != maintenance.AspectFingerprint && f.Aspect != maintenance.AspectPartitions {
			printFindings(stdout, before.Findings)
			return errMismatch
		}
	}
	if !before.Exists {
		if err := store.CreateSchema(ctx); err != nil {
			return fmt.Errorf("%w\nthe user needs the privilege to create tables; or apply the DDL of inbox schema with your migration tool", err)
		}
		fmt.Fprintf(stdout, "created %s\n", store.Table())
	}
	if finding(before, maintenance.AspectFingerprint).Want != "" && !finding(before, maintenance.AspectFingerprint).OK {
		if _, err := m.AddFingerprintColumn(ctx); err != nil {
			return explain(err, store.Table(), "ALTER")
		}
		fmt.Fprintf(stdout, "added the fingerprint column to %s\n", store.Table())
	}
	if m.Partitioned() {
		if err := createPartitions(ctx, m, ahead, !before.Exists, stdout); err != nil {
			return err
		}
	}
	after, err := m.Check(ctx, ahead)
	if err != nil {
		return err
	}
	if !after.OK() {
		printFindings(stdout, after.Findings)
		return errMismatch
	}
	return nil
}

var errMismatch = errors.New("the table does not match the configuration, and applying the schema does not change an existing table: check the flags against the table as created (inbox check says more)")

// createPartitions makes the partitions of now and the next ahead periods,
// as a purge round would, and those a round cannot make because the
// default partition holds rows of their period, moving those rows into
// them. On a table just created it first lists those CreateSchema made.
func createPartitions(ctx context.Context, m maintenance.Store, ahead int, fresh bool, stdout io.Writer) error {
	sess, busy, err := m.BeginPurge(ctx)
	if err != nil {
		return err
	}
	if busy != nil {
		fmt.Fprintln(stdout, "a purge of the table is running; it creates the partitions ahead")
		return nil
	}
	defer sess.Close() //nolint:errcheck // Close discards the connection when the unlock fails
	if fresh {
		made, err := sess.Partitions(ctx)
		if err != nil {
			return err
		}
		for _, p := range made {
			fmt.Fprintf(stdout, "created partition %s\n", p.Name)
		}
	}
	parts, err := sess.CreatePartitions(ctx, ahead, purge.DefaultLockTimeout)
	for _, p := range parts.Created {
		fmt.Fprintf(stdout, "created partition %s\n", p.Name)
	}
	for _, p := range parts.TimedOut {
		fmt.Fprintf(stdout, "partition %s not created: the table lock was not granted within %s; the purge creates it\n", p.Name, purge.DefaultLockTimeout)
	}
	if err != nil {
		return err
	}
	for _, p := range parts.Blocked {
		moved, err := sess.MoveBlocked(ctx, p, purge.DefaultLockTimeout)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "created partition %s, moving its period's %s out of the default partition\n", p.Name, count(int(moved), "row"))
	}
	return nil
}

// finding returns the finding about one aspect, or a zero Finding.
func finding(c maintenance.TableCheck, aspect string) maintenance.Finding {
	for _, f := range c.Findings {
		if f.Aspect == aspect {
			return f
		}
	}
	return maintenance.Finding{}
}
