package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/clock"
	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// idsFlag collects repeated -id values.
type idsFlag []string

func (f *idsFlag) String() string     { return strings.Join(*f, ",") }
func (f *idsFlag) Set(s string) error { *f = append(*f, s); return nil }

// timeFlag is a point in time: RFC 3339, or a UTC date.
type timeFlag struct{ t time.Time }

func (f *timeFlag) String() string {
	if f.t.IsZero() {
		return ""
	}
	return f.t.Format(time.RFC3339Nano)
}

func (f *timeFlag) Set(s string) error {
	for _, layout := range []string{time.RFC3339Nano, time.DateOnly} {
		if t, err := time.Parse(layout, s); err == nil {
			f.t = t.UTC()
			return nil
		}
	}
	return fmt.Errorf("%q: want RFC 3339 (2025-01-02T15:04:05Z) or a UTC date (2025-01-02)", s)
}

// runForget removes one consumer's claims of chosen events, so that the
// next copy of each (a replay) is processed again. Without -yes it only
// prints what it would remove.
func runForget(ctx context.Context, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	setUsage(fs, stderr,
		"usage: inbox forget -dsn DSN -consumer NAME (-id ID ... | -ids-file FILE | -from TIME [-to TIME]) [-yes]",
		"Removes a consumer's claims of chosen events, so that a replay processes them again.",
		"Prints what it would remove unless -yes is given.",
	)
	db := addDatabaseFlags(fs)
	consumer := fs.String("consumer", "", "the consumer whose claims to remove (required; the handler name by default in inbox.Config)")
	var ids idsFlag
	var from, to timeFlag
	fs.Var(&ids, "id", "an event id whose claim to remove (repeatable)")
	idsFile := fs.String("ids-file", "", "a file of event ids, one per line (blank lines are skipped)")
	fs.Var(&from, "from", "remove the claims made at or after this time (RFC 3339 or a UTC date)")
	fs.Var(&to, "to", "with -from: and before this time (default: now)")
	yes := fs.Bool("yes", false, "remove the claims; without it, only print what would be removed")
	if err := parse(fs, args); err != nil {
		return err
	}
	byIDs := len(ids) > 0 || *idsFile != ""
	switch {
	case *consumer == "":
		return usage("-consumer is required: claims belong to one consumer, and the others keep theirs")
	case !to.t.IsZero() && from.t.IsZero():
		return usage("-to needs -from")
	case byIDs && !from.t.IsZero():
		return usage("choose the events by id (-id, -ids-file) or by time (-from, -to), not both")
	case !byIDs && from.t.IsZero():
		return usage("choose the events: -id, -ids-file, or -from (and -to)")
	case !to.t.IsZero() && !from.t.Before(to.t):
		return usage("-from %s is not before -to %s", from.String(), to.String())
	}
	store, sqlDB, err := db.store()
	if err != nil {
		return err
	}
	_ = sqlDB.Close()
	filter := maintenance.ClaimFilter{Consumer: *consumer, From: from.t, To: to.t}
	if byIDs {
		// Every id is checked before anything connects: one bad line and
		// nothing is removed.
		if filter.EventIDs, err = readIDs(store, ids, *idsFile); err != nil {
			return err
		}
	} else if filter.To.IsZero() {
		filter.To = clock.Now().Add(24 * time.Hour) // any claim made until now, whatever the clocks' skew
	}

	store, sqlDB, err = db.connectTable(ctx)
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	m := store.Maintenance()
	claims, err := m.Claims(ctx, filter)
	if err != nil {
		return err
	}
	if len(claims) == 0 {
		if err := knownConsumer(ctx, m, *consumer); err != nil {
			return err
		}
	}
	if !*yes {
		fmt.Fprintf(stdout, "would remove %s of consumer %s from %s:\n", count(len(claims), "claim"), showValue(*consumer), store.Table())
		printClaims(stdout, claims)
		printNotFound(stdout, filter.EventIDs, claims)
		fmt.Fprintln(stdout, "dry run: nothing removed; add -yes to remove them")
		return nil
	}
	forget := filter.EventIDs
	if !byIDs {
		for _, c := range claims {
			forget = append(forget, c.EventID)
		}
	}
	if len(forget) == 0 {
		fmt.Fprintf(stdout, "no claims of consumer %s to remove from %s\n", showValue(*consumer), store.Table())
		return nil
	}
	removed, err := m.Forget(ctx, *consumer, forget)
	if err != nil && len(removed) == 0 {
		return explain(err, store.Table(), "DELETE (and on PostgreSQL INSERT)")
	}
	fmt.Fprintf(stdout, "removed %s of consumer %s from %s:\n", count(len(removed), "claim"), showValue(*consumer), store.Table())
	printClaims(stdout, removed)
	if err != nil {
		return fmt.Errorf("removed %s, then failed: %w", count(len(removed), "claim"), explain(err, store.Table(), "DELETE (and on PostgreSQL INSERT)"))
	}
	printNotFound(stdout, filter.EventIDs, removed)
	if len(removed) == 0 {
		// Another forget, or the purge, removed them since they were listed.
		fmt.Fprintln(stdout, "nothing changed: the next copy of these events is processed as before")
		return nil
	}
	what := "these events"
	if len(removed) == 1 {
		what = "this event"
	}
	fmt.Fprintf(stdout, "the next copy of %s will be processed again\n", what)
	return nil
}

// readIDs returns the ids of -id and of the file, validated as the
// middleware validates them and in the form the store keeps (a canonical
// UUID), without duplicates. Every bad one is reported, with its line.
func readIDs(store *sqlinbox.Store, flagIDs []string, file string) ([]string, error) {
	var ids, bad []string
	check := func(where, id string) {
		err := inboxdriver.ValidateEventID(id)
		if err == nil {
			id, err = store.CheckEventID(id)
		}
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", where, err))
			return
		}
		ids = append(ids, id)
	}
	for _, id := range flagIDs {
		check("-id", id)
	}
	if file != "" {
		if err := scanIDFile(file, check); err != nil {
			return nil, err
		}
	}
	if len(bad) > 0 {
		return nil, usage("%s, nothing removed:\n%s", count(len(bad), "bad event id"), strings.Join(bad, "\n"))
	}
	if len(ids) == 0 {
		return nil, usage("%s holds no event id", file)
	}
	return slices.Compact(slices.Sorted(slices.Values(ids))), nil
}

// scanIDFile calls check with "file:line" and each line's id. Lines end
// with \n or \r\n; blank lines are skipped. Ids are taken as they are,
// spaces included: the inbox compares them byte for byte.
func scanIDFile(file string, check func(where, id string)) error {
	f, err := os.Open(file)
	if err != nil {
		return usage("-ids-file: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), maxIDLine)
	line := 1
	for ; sc.Scan(); line++ {
		if id := strings.TrimSuffix(sc.Text(), "\r"); id != "" {
			check(fmt.Sprintf("%s:%d", file, line), id)
		}
	}
	switch err := sc.Err(); {
	case errors.Is(err, bufio.ErrTooLong):
		// The scanner stops at the line it cannot hold: line is its number.
		return usage("-ids-file %s:%d: the line is longer than 1 MiB (%d bytes), the longest -ids-file reads; an event id is at most %d bytes: put one id per line",
			file, line, maxIDLine, inbox.MaxEventIDLength)
	case err != nil:
		return usage("-ids-file %s: %v", file, err)
	}
	return nil
}

// maxIDLine is the longest line of an -ids-file, far above any event id, so
// that a line this long is a file of something else.
const maxIDLine = 1 << 20

// knownConsumer fails when consumer has no claim at all in the table:
// most likely a misspelt name.
func knownConsumer(ctx context.Context, m maintenance.Store, consumer string) error {
	consumers, err := m.Consumers(ctx)
	if err != nil {
		return err
	}
	if slices.Contains(consumers, consumer) {
		return nil
	}
	quoted := make([]string, len(consumers))
	for i, c := range consumers {
		quoted[i] = showValue(c)
	}
	if len(consumers) == 0 {
		return fmt.Errorf("consumer %s has no claims in %s, which holds none: check -table and -dsn", showValue(consumer), m.Table())
	}
	return fmt.Errorf("consumer %s has no claims in %s; consumers with claims: %s (-consumer is the handler's name unless inbox.Config.Consumer sets one)",
		showValue(consumer), m.Table(), strings.Join(quoted, ", "))
}

func printClaims(w io.Writer, claims []maintenance.Claim) {
	if len(claims) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  EVENT ID\tCLAIMED AT (UTC)")
	for _, c := range claims {
		fmt.Fprintf(tw, "  %s\t%s\n", showValue(c.EventID), c.ProcessedAt.Format(time.RFC3339Nano))
	}
	_ = tw.Flush()
}

// printNotFound lists the ids asked for that have no claim.
func printNotFound(w io.Writer, asked []string, claims []maintenance.Claim) {
	found := make(map[string]bool, len(claims))
	for _, c := range claims {
		found[c.EventID] = true
	}
	var missing []string
	for _, id := range asked {
		if !found[id] {
			missing = append(missing, showValue(id))
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(w, "%s no claim of this consumer: %s\n", count(len(missing), "id has", "ids have"), strings.Join(missing, ", "))
	}
}

// showValue prints an id or a consumer as it is when every character is
// visible, else quoted with escapes.
func showValue(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsGraphic(r) || unicode.IsSpace(r) || r == '"' || r == ',' }) < 0 {
		return s
	}
	return strconv.Quote(s)
}

// count renders n things: count(1, "claim") is "1 claim", count(2,
// "claim") "2 claims"; an irregular plural comes third.
func count(n int, one string, many ...string) string {
	if n == 1 {
		return "1 " + one
	}
	if len(many) > 0 {
		return fmt.Sprintf("%d %s", n, many[0])
	}
	return fmt.Sprintf("%d %ss", n, one)
}
