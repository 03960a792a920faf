package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
)

// forgetFixture has billing's claims e1..e5 (3 days old) and n1, n2 (an
// hour old), and mailer's e1.
func forgetFixture(t *testing.T, tg target, flags ...string) *fixture {
	t.Helper()
	f := setup(t, tg, flags...)
	f.seed(t, "billing", 3*day, ids("e", 5)...)
	f.seed(t, "billing", time.Hour, "n1", "n2")
	f.seed(t, "mailer", 3*day, "e1")
	return f
}

// Without -yes forget lists what it would remove and removes nothing; with
// it, it removes exactly those claims of that consumer, and the next copy
// of each event is processed again.
func TestForgetDryRunThenYes(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := forgetFixture(t, tg)
		before := f.rows(t)
		code, out, errOut := f.run(t, "forget", "-consumer", "billing", "-id", "e2", "-id", "e4", "-id", "e9")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "would remove 2 claims of consumer billing from "+f.table)
		require.Regexp(t, `\n  e2 +\d{4}-\d\d-\d\dT`, out)
		require.Regexp(t, `\n  e4 +\d{4}-`, out)
		require.Contains(t, out, "1 id has no claim of this consumer: e9")
		require.Contains(t, out, "dry run: nothing removed; add -yes")
		require.Equal(t, before, f.rows(t))
		require.False(t, f.claim(t, "billing", "e2"), "still a duplicate")

		code, out, errOut = f.run(t, "forget", "-consumer", "billing", "-id", "e2", "-id", "e4", "-id", "e9", "-yes")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "removed 2 claims of consumer billing from "+f.table)
		require.Contains(t, out, "1 id has no claim of this consumer: e9")
		require.Equal(t, map[string]int{"billing": 5, "mailer": 1}, f.rows(t))
		require.True(t, f.claim(t, "billing", "e2"), "processed again")
		require.True(t, f.claim(t, "billing", "e4"), "processed again")
		require.False(t, f.claim(t, "billing", "e1"), "not chosen: still a duplicate")
		require.False(t, f.claim(t, "mailer", "e1"), "another consumer's claim stays")
	})
}

// An id file: one id per line, blank lines skipped, \r\n line ends. A bad
// line is reported with its line number, and nothing is removed, not even
// the good lines' claims.
func TestForgetIDsFile(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := forgetFixture(t, tg)
		dir := t.TempDir()
		good := filepath.Join(dir, "good.txt")
		require.NoError(t, os.WriteFile(good, []byte("e1\r\n\ne3\ne3\n"), 0o600))
		bad := filepath.Join(dir, "bad.txt")
		require.NoError(t, os.WriteFile(bad, []byte("e1\nbad\x00id\n\nok\n\xff\xfe\n"+strings.Repeat("x", 300)+"\n"), 0o600))

		code, out, errOut := f.run(t, "forget", "-consumer", "billing", "-ids-file", bad, "-id", "", "-yes")
		require.Equal(t, exitUsage, code, out)
		require.Contains(t, errOut, "4 bad event ids, nothing removed:")
		require.Contains(t, errOut, "-id: inbox: invalid event id: empty")
		require.Contains(t, errOut, bad+":2: inbox: invalid event id: contains a NUL byte")
		require.Contains(t, errOut, bad+":5: inbox: invalid event id: not valid UTF-8")
		require.Contains(t, errOut, bad+":6: inbox: invalid event id: 300 bytes")
		require.NotContains(t, errOut, bad+":1:")
		require.NotContains(t, errOut, bad+":4:")
		require.Empty(t, out)
		require.Equal(t, map[string]int{"billing": 7, "mailer": 1}, f.rows(t))

		code, _, errOut = f.run(t, "forget", "-consumer", "billing", "-ids-file", filepath.Join(dir, "missing.txt"))
		require.Equal(t, exitUsage, code)
		require.Contains(t, errOut, "-ids-file: open")

		code, out, errOut = f.run(t, "forget", "-consumer", "billing", "-ids-file", good, "-yes")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "removed 2 claims of consumer billing")
		require.Equal(t, map[string]int{"billing": 5, "mailer": 1}, f.rows(t))
	})
}

// A line longer than the longest the command reads (a file of something
// else, ids joined without newlines) names its line and the limit, and
// nothing is removed.
func TestForgetIDsFileLineTooLong(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := forgetFixture(t, tg)
		file := filepath.Join(t.TempDir(), "ids.txt")
		require.NoError(t, os.WriteFile(file, []byte("e1\ne2\n"+strings.Repeat("e3,", 400_000)+"\ne4\n"), 0o600))
		code, out, errOut := f.run(t, "forget", "-consumer", "billing", "-ids-file", file, "-yes")
		require.Equal(t, exitUsage, code, out)
		require.Contains(t, errOut, file+":3: the line is longer than 1 MiB (1048576 bytes), the longest -ids-file reads; an event id is at most 255 bytes: put one id per line")
		require.Empty(t, out)
		require.Equal(t, map[string]int{"billing": 7, "mailer": 1}, f.rows(t))
	}, sqlite)
}

// In UUID mode an id that is not a UUID is a bad line, and ids are
// matched in their canonical form whatever their case.
func TestForgetUUIDs(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := setup(t, tg, "-uuid-event-ids")
		const id = "6f1d2c1e-0000-4000-8000-00000000000a"
		require.True(t, f.claim(t, "billing", id))
		file := filepath.Join(t.TempDir(), "ids.txt")
		require.NoError(t, os.WriteFile(file, []byte(strings.ToUpper(id)+"\nnot-a-uuid\n"), 0o600))
		code, _, errOut := f.run(t, "forget", "-uuid-event-ids", "-consumer", "billing", "-ids-file", file, "-yes")
		require.Equal(t, exitUsage, code)
		require.Contains(t, errOut, file+`:2: inbox: invalid event id: "not-a-uuid" is not a UUID`)

		code, out, errOut := f.run(t, "forget", "-uuid-event-ids", "-consumer", "billing", "-id", strings.ToUpper(id), "-yes")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "removed 1 claim ")
		require.Contains(t, out, "  "+id+"  ")
		require.True(t, f.claim(t, "billing", id), "processed again")
	})
}

// -from and -to choose the claims made in a time range.
func TestForgetTimeRange(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := forgetFixture(t, tg)
		from := testdb.Now().UTC().Add(-2 * time.Hour).Format(time.RFC3339)
		code, out, errOut := f.run(t, "forget", "-consumer", "billing", "-from", from)
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "would remove 2 claims")
		require.Equal(t, map[string]int{"billing": 7, "mailer": 1}, f.rows(t))

		to := testdb.Now().UTC().Add(-2 * day).Format(time.RFC3339)
		code, out, errOut = f.run(t, "forget", "-consumer", "billing", "-from", "2000-01-01", "-to", to, "-yes")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "removed 5 claims")
		require.Equal(t, map[string]int{"billing": 2, "mailer": 1}, f.rows(t))

		code, out, errOut = f.run(t, "forget", "-consumer", "billing", "-from", "2000-01-01", "-to", to, "-yes")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "no claims of consumer billing to remove")
	})
}

// Forget refuses to guess: no consumer, no events, both kinds of choice,
// a consumer without any claim. Nothing is removed.
func TestForgetRefuses(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := forgetFixture(t, tg)
		for _, tc := range []struct {
			args []string
			code int
			err  string
		}{
			{[]string{"-id", "e1", "-yes"}, exitUsage, "-consumer is required"},
			{[]string{"-consumer", "billing", "-yes"}, exitUsage, "choose the events"},
			{[]string{"-consumer", "billing", "-id", "e1", "-from", "2000-01-01", "-yes"}, exitUsage, "not both"},
			{[]string{"-consumer", "billing", "-to", "2000-01-01", "-yes"}, exitUsage, "-to needs -from"},
			{[]string{"-consumer", "billing", "-from", "2001-01-01", "-to", "2000-01-01", "-yes"}, exitUsage, "is not before"},
			{[]string{"-consumer", "billing", "-from", "yesterday", "-yes"}, exitUsage, "want RFC 3339"},
			{[]string{"-consumer", "Billing", "-id", "e1", "-yes"}, exitFailed, `consumer Billing has no claims in ` + f.table + `; consumers with claims: billing, mailer`},
			{[]string{"-consumer", "billing", "-id", "e1", "-yes", "-table", "missing_table"}, exitFailed, "missing_table does not exist in this database"},
			{[]string{"-consumer", "billing", "-id", "e1", "-yes", "-dsn", unreachable(tg)}, exitConnect, "cannot "},
		} {
			code, out, errOut := f.run(t, "forget", tc.args...)
			require.Equal(t, tc.code, code, "%v: %s%s", tc.args, out, errOut)
			require.Contains(t, errOut, tc.err, "%v", tc.args)
		}
		require.Equal(t, map[string]int{"billing": 7, "mailer": 1}, f.rows(t))
	})
}

// A user that may only read the table sees what forget would remove; with
// -yes forget fails, says what the user lacks, and removes nothing.
func TestForgetReadOnlyUser(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := forgetFixture(t, tg)
		ro := []string{"forget", "-dialect", tg.dialect, "-dsn", tg.readOnly(t, f.db, f.table), "-table", f.table, "-consumer", "billing", "-id", "e1"}
		code, out, errOut := runCmd(ro...)
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "would remove 1 claim ")
		code, out, errOut = runCmd(append(ro, "-yes")...)
		require.Equal(t, exitFailed, code, out)
		require.Empty(t, out)
		require.Contains(t, errOut, "the database refused to write")
		require.Contains(t, errOut, "\nthe user needs DELETE")
		require.Equal(t, map[string]int{"billing": 7, "mailer": 1}, f.rows(t))
	})
}

// A claim of the event in flight (its transaction open, the handler
// running) is not visible to a plain DELETE. Forget waits for it as a
// second copy's claim would, then removes the committed claim: the replay
// that forget was run for is processed.
func TestForgetWaitsForAClaimInFlight(t *testing.T) {
	test := func(t *testing.T, tg target, flags ...string) {
		f := forgetFixture(t, tg, flags...)
		tx, _, err := f.store.Claim(context.Background(), inboxdriver.Claim{Consumer: "billing", EventID: "inflight"})
		require.NoError(t, err)
		require.NotNil(t, tx, "a new claim")
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // before the table is dropped, if the test fails
		done := make(chan struct{})
		var code int
		var out, errOut string
		go func() {
			defer close(done)
			code, out, errOut = f.run(t, "forget", append(flags, "-consumer", "billing", "-id", "inflight", "-yes")...)
		}()
		if tg.waiting != nil { // SQLite: its one write lock makes forget wait
			var err error
			require.Eventually(t, func() bool {
				select {
				case <-done:
					return true // finished without waiting: the assertions below fail
				default:
					var waiting bool
					waiting, err = tg.waiting(f.db, f.table)
					return waiting || err != nil
				}
			}, 30*time.Second, 10*time.Millisecond)
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit(context.Background()))
		<-done
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "removed 1 claim of consumer billing")
		require.Contains(t, out, "  inflight  ")
		require.True(t, f.claim(t, "billing", "inflight"), "the replay is processed")
	}
	forEach(t, func(t *testing.T, tg target) { test(t, tg) })
	t.Run("PostgreSQL partitioned", func(t *testing.T) {
		t.Parallel()
		test(t, postgres, "-partitioning", "daily")
	})
}

// Forgetting ids of which none has a claim removes nothing, and says that
// nothing changes rather than promising that they will be processed again.
func TestForgetNothingRemoved(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := forgetFixture(t, tg)
		code, out, errOut := f.run(t, "forget", "-consumer", "billing", "-id", "never-claimed", "-yes")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "removed 0 claims of consumer billing")
		require.Contains(t, out, "1 id has no claim of this consumer: never-claimed\n")
		require.True(t, strings.HasSuffix(out, "nothing changed: the next copy of these events is processed as before\n"), out)
		require.NotContains(t, out, "will be processed again")

		code, out, errOut = f.run(t, "forget", "-consumer", "billing", "-id", "never-claimed", "-id", "e1", "-yes")
		require.Equal(t, exitOK, code, errOut)
		require.True(t, strings.HasSuffix(out, "the next copy of this event will be processed again\n"), out)
	}, postgres)
}
