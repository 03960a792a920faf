package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fixture is inbox-bench's output for two PostgreSQL drivers at c=1 and
// c=8, bare, inbox and dup.
const fixture = "testdata/inbox-bench.txt"

// TestMain stands in for an inbox-bench build when the environment says
// so: the test binary prints the fixture, or fails, as a build would.
func TestMain(m *testing.M) {
	switch os.Getenv("INTERLEAVE_FAKE_BENCH") {
	case "":
		os.Exit(m.Run())
	case "fail":
		os.Stdout.WriteString("inbox-bench: the database refused the connection\n")
		os.Exit(1)
	default:
		b, err := os.ReadFile(os.Getenv("INTERLEAVE_FAKE_BENCH"))
		if err != nil {
			panic(err)
		}
		os.Stdout.Write(b)
		os.Exit(0)
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	f, err := os.Open(fixture)
	require.NoError(t, err)
	defer f.Close()
	res, err := parse(f)
	require.NoError(t, err)
	require.Equal(t, 0.41, res.ratio[row{"postgresql/pgx-stdlib", 8, "inbox"}])
	require.Equal(t, 7.31, res.ratio[row{"postgresql/pgx", 8, "dup"}])
	require.Equal(t, 0.69, res.floor[row{"postgresql/pgx-stdlib", 8, ""}])
	require.Equal(t, 1.16, res.floor[row{"postgresql/pgx", 1, ""}])
	require.Equal(t, 39.0, res.allocs[row{"postgresql/pgx-stdlib", 0, "inbox"}])
	require.Len(t, res.order, 12) // 2 drivers, 2 concurrencies, 3 modes
	require.Equal(t, row{"postgresql/pgx", 1, "bare"}, res.order[0])
}

// A row with errors has no ratio worth comparing: the comparison stops.
func TestParseRefusesErrors(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(fixture)
	require.NoError(t, err)
	broken := strings.Replace(string(b), "   7.31        \n", "   7.31  3 (inbox: claiming event: connection refused)\n", 1)
	require.NotEqual(t, string(b), broken)
	_, err = parse(strings.NewReader(broken))
	require.ErrorContains(t, err, "postgresql/pgx c=8 dup had errors")
}

// Two builds, three rounds: each build runs once per round, every run's
// output is kept, and the report has each build's column, the floor and
// the distance to it.
func TestRun(t *testing.T) {
	t.Setenv("INTERLEAVE_FAKE_BENCH", fixture)
	self, err := os.Executable()
	require.NoError(t, err)
	logs := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-rounds", "3", "-log", logs, "old=" + self, "new=" + self, "--", "-c", "1,8"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	kept, err := filepath.Glob(filepath.Join(logs, "*.txt"))
	require.NoError(t, err)
	require.Len(t, kept, 6)
	out := stdout.String()
	require.Contains(t, out, "3 rounds")
	require.Regexp(t, `driver\s+c\s+mode\s+old\s+new\s+floor \(all runs\)\s+old - floor\s+new - floor`, out)
	require.Regexp(t, `postgresql/pgx-stdlib\s+8\s+inbox\s+0\.41 \(0\.41 to 0\.41\)\s+0\.41 \(0\.41 to 0\.41\)\s+0\.69 \(0\.69 to 0\.69\)\s+-0\.28 \(-0\.28 to -0\.28\)`, out)
	require.Regexp(t, `postgresql/pgx-stdlib\s+inbox\s+39\s+39`, out)
	// Rounds alternate the order: old first, then new first.
	runs := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	require.Len(t, runs, 6)
	require.Regexp(t, `round 1 of 3: old `, runs[0])
	require.Regexp(t, `round 2 of 3: new `, runs[2])
}

// A build that fails stops the comparison, with its output.
func TestRunStopsOnAFailedBuild(t *testing.T) {
	t.Setenv("INTERLEAVE_FAKE_BENCH", "fail")
	self, err := os.Executable()
	require.NoError(t, err)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-rounds", "2", "old=" + self, "--"}, &stdout, &stderr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr.String(), "the database refused the connection")
}
