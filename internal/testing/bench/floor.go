package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Floor is the server's own price of the claim, measured by pgbench in
// pipeline mode: each transaction (BEGIN, the claim's INSERT ... ON
// CONFLICT DO NOTHING, the business write, COMMIT) travels in one round
// trip with prepared statements, so the client's work and its round trips
// drop out. The claim's transaction against the same without the claim is
// the best ratio a client could reach on this server; what a driver loses
// beyond it is the client's share.
type Floor struct {
	pgbench string
	dsn     string
	dir     string
	bare    string // the script without the claim
	claim   string // the script with it
	admin   *Admin
	tables  []string
	reset   []string // what Reset empties
}

// ErrNoPgbench is returned by [FindPgbench] when pgbench is neither on the
// PATH nor in a PostgreSQL installation's bin directory.
var ErrNoPgbench = errors.New("pgbench not found on the PATH nor in /usr/lib/postgresql/*/bin (Debian: apt-get install postgresql-client)")

// FindPgbench returns the path of pgbench: the PATH's, else the newest of
// Debian's /usr/lib/postgresql/*/bin.
func FindPgbench() (string, error) {
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
	if len(found) == 0 {
		return "", ErrNoPgbench
	}
	slices.SortFunc(found, func(a, b string) int { return versionOf(a) - versionOf(b) })
	return found[len(found)-1], nil
}

func versionOf(path string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return n
}

// NewFloor creates, on PostgreSQL, an inbox table of c (through the
// library, as [Admin.CreateInbox] does) and the business write of kind, under
// fresh names, and writes the two pgbench scripts. c must describe a plain
// table whose claim is the INSERT alone (no partitioning, claim timeout or
// fingerprints): the floor is the one-statement claim's.
func (a *Admin) NewFloor(ctx context.Context, pgbench, dsn string, c sqlinbox.Config, kind string) (_ *Floor, err error) {
	if a.d.dialect != sqlinbox.PostgreSQL {
		return nil, fmt.Errorf("the floor is measured with pgbench, on PostgreSQL, not %s", a.d.dialect)
	}
	f := &Floor{pgbench: pgbench, dsn: dsn, admin: a}
	defer func() {
		if err != nil {
			_ = f.Close(context.WithoutCancel(ctx))
		}
	}()
	w, err := a.CreateWrite(ctx, kind, "inbox_bench_floor")
	if err != nil {
		return nil, err
	}
	f.tables, f.reset = append(f.tables, w.tables...), append(f.reset, w.appended...)
	c.Dialect, c.Table = sqlinbox.PostgreSQL, Name("inbox_bench_floor")
	if err := a.CreateInbox(ctx, c); err != nil {
		return nil, err
	}
	f.tables, f.reset = append(f.tables, c.Table), append(f.reset, c.Table)
	store, err := sqlinbox.New(a.db, c)
	if err != nil {
		return nil, err
	}
	claim := store.Maintenance().ClaimSQL()
	args, err := claim.Args(inboxdriver.Claim{Consumer: Consumer, EventID: "00000000-0000-0000-0000-000000000000"})
	if err != nil {
		return nil, err
	}
	if claim.Before != "" || claim.After != "" || len(args) != 2 {
		return nil, errors.New("the floor covers the claim of a plain table, one INSERT with the consumer and the event id")
	}
	// Random ids, as new events' UUIDv4 ids: the 36 characters of a uuid's
	// text, or the uuid itself for a uuid column (the business tables'
	// text column takes it by assignment).
	id := `md5(:n::text)::uuid::text`
	if c.UUIDEventIDs {
		id = `md5(:n::text)::uuid`
	}
	stmts := []string{"BEGIN;"}
	for i, q := range w.stmts {
		stmts = append(stmts, substitute(q, w.floorArgs[i], id)+";")
	}
	stmts = append(stmts, "COMMIT;")
	set := append([]string{`\set n random(1, 9223372036854775806)`}, w.floorSet...)
	claimStmt := substitute(claim.Insert, []string{"'" + Consumer + "'", "id"}, id) + ";"
	if f.dir, err = os.MkdirTemp("", "inbox-bench-floor"); err != nil {
		return nil, err
	}
	f.bare, f.claim = filepath.Join(f.dir, "bare.sql"), filepath.Join(f.dir, "claim.sql")
	if err := os.WriteFile(f.bare, []byte(script(set, stmts)), 0o600); err != nil {
		return nil, err
	}
	withClaim := slices.Insert(slices.Clone(stmts), 1, claimStmt)
	if err := os.WriteFile(f.claim, []byte(script(set, withClaim)), 0o600); err != nil {
		return nil, err
	}
	return f, nil
}

// substitute replaces q's $n parameters, last first so that $1 does not
// match $10, by exprs[n-1] ("id": the event id's expression id).
func substitute(q string, exprs []string, id string) string {
	for n := len(exprs); n >= 1; n-- {
		e := exprs[n-1]
		if e == "id" {
			e = id
		}
		q = strings.ReplaceAll(q, "$"+strconv.Itoa(n), e)
	}
	return q
}

// script is a pgbench script sending stmts in one pipeline after the set
// lines.
func script(set, stmts []string) string {
	return strings.Join(set, "\n") + "\n\\startpipeline\n" + strings.Join(stmts, "\n") + "\n\\endpipeline\n"
}

// Scripts returns the text of the scripts without and with the claim, as
// run.
func (f *Floor) Scripts() (bare, claim string, err error) {
	b, err := os.ReadFile(f.bare)
	if err != nil {
		return "", "", err
	}
	c, err := os.ReadFile(f.claim)
	return string(b), string(c), err
}

// tpsLine is pgbench's result line.
var tpsLine = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)

// Run runs pgbench for d (whole seconds, at least one) with clients
// connections, with the claim or without, and returns its transactions per
// second.
func (f *Floor) Run(ctx context.Context, withClaim bool, clients int, d time.Duration) (float64, error) {
	file := f.bare
	if withClaim {
		file = f.claim
	}
	secs := max(1, int((d+time.Second/2)/time.Second))
	threads := min(clients, runtime.GOMAXPROCS(0))
	cmd := exec.CommandContext(ctx, f.pgbench, "-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(threads),
		"-T", strconv.Itoa(secs), "-f", file, f.dsn)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s: %w: %s", f.pgbench, err, strings.TrimSpace(stderr.String()))
	}
	m := tpsLine.FindSubmatch(out.Bytes())
	if m == nil {
		return 0, fmt.Errorf("%s printed no tps line: %s", f.pgbench, strings.TrimSpace(out.String()))
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// Reset empties the tables the scripts append to.
func (f *Floor) Reset(ctx context.Context) error { return f.admin.Truncate(ctx, f.reset...) }

// Close drops the floor's tables and removes its scripts.
func (f *Floor) Close(ctx context.Context) error {
	err := f.admin.Drop(ctx, f.tables...)
	if f.dir != "" {
		err = errors.Join(err, os.RemoveAll(f.dir))
	}
	return err
}

// Rows returns the rows of the floor's inbox table and of its business
// write's first table: what the scripts have written since the last [Floor.Reset].
func (f *Floor) Rows(ctx context.Context) (claims, writes int64, err error) {
	inboxTable, write := f.tables[len(f.tables)-1], f.tables[0]
	err = f.admin.db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM `+inboxTable+`), (SELECT COUNT(*) FROM `+write+`)`).Scan(&claims, &writes)
	return claims, writes, err
}
