// Command inbox looks after an inbox table: it prints or applies its
// schema, shows what it holds, forgets the claims of chosen events so that a
// replay processes them again, checks a deployment, and purges expired rows.
//
//	inbox schema -dialect sqlite > 001_inbox.sql
//	inbox schema -dsn "$DATABASE_URL" -apply
//	inbox stats -dsn "$DATABASE_URL"
//	inbox forget -dsn "$DATABASE_URL" -consumer billing -ids-file replay.txt       # dry run
//	inbox forget -dsn "$DATABASE_URL" -consumer billing -ids-file replay.txt -yes  # removes
//	inbox check -dsn "$DATABASE_URL" -retention 14d -broker-retention 7d
//	inbox purge -dsn "$DATABASE_URL" -retention 14d
//
// Every subcommand reaches the table through the same flags: -dsn, -dialect
// (postgresql, the default, mysql or sqlite), -table, -partitioning (none,
// daily or monthly, as the table was created), -partition-key (processed_at
// or event_time), -uuid-event-ids, -fingerprints and -shard-key-column,
// which mirror sqlinbox.Config. "inbox SUBCOMMAND -h" lists a subcommand's
// flags.
//
// Exit status, the same for every subcommand:
//
//	0  done; for check: every check passed; for purge: also when another
//	   instance was already purging the table (it is doing the work): the
//	   purge's last line on stdout then starts with "skipped:" instead of
//	   "removed", and says who holds the purge lock and for how long
//	1  failed: a database error, a table that does not exist, an unknown
//	   consumer; for check: a check failed
//	2  invalid flags or input (nothing was done)
//	3  cannot connect to the database
//
// Scripts must run the built or installed command: go run reports every
// failure as its own exit status 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	exitConnect = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// subcommand is one of inbox's subcommands: it parses its own flags and
// returns nil, or an error whose exit status exitCode finds.
type subcommand struct {
	name, synopsis string
	run            func(ctx context.Context, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error
}

var subcommands = []subcommand{
	{"schema", "print the table's DDL for a migration tool, or apply it (-apply)", runSchema},
	{"stats", "claims per consumer, table and index sizes, partitions", runStats},
	{"forget", "remove a consumer's claims of chosen events, so that a replay processes them again", runForget},
	{"check", "check the table against the configuration, and the purge retention against the broker's", runCheck},
	{"purge", "remove rows older than the retention, once or in a loop", runPurge},
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || slices.Contains([]string{"-h", "-help", "--help", "help"}, args[0]) {
		printUsage(stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	i := slices.IndexFunc(subcommands, func(c subcommand) bool { return c.name == args[0] })
	if i < 0 {
		fmt.Fprintf(stderr, "inbox: unknown subcommand %q\n\n", args[0])
		printUsage(stderr)
		return exitUsage
	}
	c := subcommands[i]
	fs := flag.NewFlagSet("inbox "+c.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	err := c.run(ctx, fs, args[1:], stdout, stderr)
	code := exitCode(err)
	var e *exitError
	if err != nil && !(errors.As(err, &e) && e.err == nil) {
		fmt.Fprintf(stderr, "inbox %s: %v\n", c.name, err)
	}
	return code
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: inbox SUBCOMMAND [flags]")
	fmt.Fprintln(w)
	for _, c := range subcommands {
		fmt.Fprintf(w, "  %-7s %s\n", c.name, c.synopsis)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, `"inbox SUBCOMMAND -h" lists its flags. Exit status: 0 done, 1 failed (for check: a check failed),`)
	fmt.Fprintln(w, "2 invalid flags or input, 3 cannot connect to the database.")
}

// exitError carries the exit status of an error; a nil err has already
// been reported (by the flag package).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	var e *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &e):
		return e.code
	}
	return exitFailed
}

// usage is an error in the flags or the input: exit status 2.
func usage(format string, a ...any) error {
	return &exitError{exitUsage, fmt.Errorf(format, a...)}
}

// setUsage makes -h print lines, then the flags.
func setUsage(fs *flag.FlagSet, w io.Writer, lines ...string) {
	fs.Usage = func() {
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
		fs.PrintDefaults()
	}
}

// parse parses a subcommand's flags: -h exits 0, a bad flag 2 (the flag
// package has printed why), arguments after the flags are refused.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &exitError{exitOK, nil}
		}
		return &exitError{exitUsage, nil}
	}
	if fs.NArg() > 0 {
		return usage("unexpected arguments: %q (flags come before any argument)", fs.Args())
	}
	return nil
}
