// Command interleave compares inbox-bench builds of two commits (or more)
// in one run: it runs each build in turn, round after round, with the same
// arguments, and prints per driver, concurrency and mode the median ratio to
// bare of each build with its spread, beside the PostgreSQL floor measured
// in the same rounds. A ratio measured by one build an hour after the other
// compares two machines' loads; interleaved, both see the same.
//
// Build inbox-bench from each commit outside the repository (git archive
// COMMIT | tar -x -C DIR, then go build -o BIN ./cmd/inbox-bench in
// DIR/internal/testing), then, from internal/testing:
//
//	go run ./bench/interleave -rounds 5 -log results/ \
//	    old=/path/to/inbox-bench-old new=/path/to/inbox-bench-new -- \
//	    -drivers postgresql/pgx,postgresql/pgx-stdlib,postgresql/lib-pq -c 1,8 -modes bare,inbox,dup -duration 2s -rounds 2
//
// The arguments after -- go to every build unchanged. Each round runs every
// build once, in an order that alternates (A B, B A, A B, ...) so that a
// load that drifts during the run weighs on each build alike; one sample is
// one program run, the median of its own -rounds. The 1-minute load average
// is recorded before each program run (Linux; "-" elsewhere).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// build is one inbox-bench program under comparison.
type build struct {
	name, path string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("interleave", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rounds := fs.Int("rounds", 5, "rounds; each runs every build once")
	logDir := fs.String("log", "", "directory that keeps each program run's output (default: not kept)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: interleave [-rounds N] [-log DIR] NAME=PROGRAM NAME=PROGRAM... -- INBOX-BENCH FLAGS...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rest := fs.Args()
	var builds []build
	for len(rest) > 0 && rest[0] != "--" {
		name, path, ok := strings.Cut(rest[0], "=")
		if !ok || name == "" || path == "" {
			fmt.Fprintf(stderr, "interleave: %q is not NAME=PROGRAM\n", rest[0])
			return 2
		}
		builds = append(builds, build{name, path})
		rest = rest[1:]
	}
	if len(rest) > 0 {
		rest = rest[1:]
	}
	if len(builds) == 0 || *rounds < 1 {
		fs.Usage()
		return 2
	}
	if *logDir != "" {
		if err := os.MkdirAll(*logDir, 0o755); err != nil {
			fmt.Fprintln(stderr, "interleave:", err)
			return 1
		}
	}
	samples := make(map[string][]*result, len(builds))
	var loads []string
	for r := range *rounds {
		order := slices.Clone(builds)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, b := range order {
			load := loadAverage()
			loads = append(loads, load)
			fmt.Fprintf(stderr, "interleave: %s round %d of %d: %s (load %s)\n", time.Now().UTC().Format(time.TimeOnly), r+1, *rounds, b.name, load)
			out, err := runBuild(ctx, b, rest)
			if *logDir != "" {
				file := filepath.Join(*logDir, fmt.Sprintf("%s-%d.txt", b.name, r+1))
				if werr := os.WriteFile(file, out, 0o644); werr != nil {
					fmt.Fprintln(stderr, "interleave:", werr)
				}
			}
			if err != nil {
				fmt.Fprintf(stderr, "interleave: %s: %v\n%s", b.name, err, tail(out))
				return 1
			}
			res, err := parse(bytes.NewReader(out))
			if err != nil {
				fmt.Fprintf(stderr, "interleave: reading %s's output: %v\n", b.name, err)
				return 1
			}
			res.load = load
			samples[b.name] = append(samples[b.name], res)
		}
	}
	if err := report(stdout, builds, samples, loads); err != nil {
		fmt.Fprintln(stderr, "interleave:", err)
		return 1
	}
	return 0
}

func runBuild(ctx context.Context, b build, args []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, b.path, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

func tail(out []byte) string {
	const keep = 2000
	if len(out) > keep {
		out = out[len(out)-keep:]
	}
	return string(out)
}

// loadAverage is the 1-minute load average, "-" where the system does not
// tell it as Linux does.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "-"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "-"
}

// row names one line of inbox-bench's throughput tables.
type row struct {
	driver string
	c      int
	mode   string
}

// result is what one inbox-bench run printed.
type result struct {
	ratio  map[row]float64
	floor  map[row]float64 // row.mode is ""
	allocs map[row]float64 // row.c is 0
	order  []row           // the rows in the order printed
	load   string
}

var (
	driverLine = regexp.MustCompile(`^== (\S+)$`)
	floorLine  = regexp.MustCompile(`^(\S+) c=(\d+): inbox [0-9.]+ of bare.*; floor ([0-9.]+), rounds`)
)

// parse reads inbox-bench's output: the allocations of the one at a time
// table, the ratio column of each concurrency's table, and the floor line.
// A throughput row with errors is an error: its ratio measures the
// failures.
func parse(r io.Reader) (*result, error) {
	res := &result{ratio: map[row]float64{}, floor: map[row]float64{}, allocs: map[row]float64{}}
	var driver, table string
	c := 0
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		switch {
		case driverLine.MatchString(line):
			driver, table = driverLine.FindStringSubmatch(line)[1], ""
		case floorLine.MatchString(line):
			m := floorLine.FindStringSubmatch(line)
			n, _ := strconv.Atoi(m[2])
			v, err := strconv.ParseFloat(m[3], 64)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", line, err)
			}
			res.floor[row{m[1], n, ""}] = v
			table = ""
		case len(f) == 0:
			table = ""
		case f[0] == "one" && slices.Contains(f, "allocs/msg"):
			table = "costs"
		case strings.HasPrefix(f[0], "c=") && len(f) > 1 && f[1] == "msgs/s":
			n, err := strconv.Atoi(strings.TrimPrefix(f[0], "c="))
			if err != nil {
				return nil, fmt.Errorf("%q: %w", line, err)
			}
			c, table = n, "throughput"
		case table == "costs" && driver != "":
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				table = ""
				continue
			}
			res.allocs[row{driver, 0, f[0]}] = v
		case table == "throughput" && driver != "" && len(f) >= 5:
			v, err := strconv.ParseFloat(f[4], 64)
			if err != nil {
				table = ""
				continue
			}
			if len(f) > 5 {
				return nil, fmt.Errorf("%s c=%d %s had errors: %s", driver, c, f[0], strings.Join(f[5:], " "))
			}
			k := row{driver, c, f[0]}
			res.ratio[k] = v
			res.order = append(res.order, k)
		default:
			table = ""
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(res.ratio) == 0 {
		return nil, errors.New("no throughput table found")
	}
	return res, nil
}

// report prints, per row, each build's median ratio with its range and the
// floor over every build's runs; then allocations per message and the load.
func report(w io.Writer, builds []build, samples map[string][]*result, loads []string) error {
	first := samples[builds[0].name]
	n := len(first)
	fmt.Fprintf(w, "%d rounds, each build once per round, order alternating; medians (min to max) of one value per program run\n", n)
	fmt.Fprintf(w, "load (1-minute average before each program run): median %s, max %s; %s\n\n", medianString(loads), maxString(loads), strings.Join(loads, " "))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "driver\tc\tmode"
	for _, b := range builds {
		head += "\t" + b.name
	}
	head += "\tfloor (all runs)"
	for _, b := range builds {
		head += "\t" + b.name + " - floor"
	}
	fmt.Fprintln(tw, head+"\t")
	for _, k := range first[0].order {
		line := fmt.Sprintf("%s\t%d\t%s", k.driver, k.c, k.mode)
		for _, b := range builds {
			line += "\t" + spread(values(samples[b.name], func(r *result) (float64, bool) { v, ok := r.ratio[k]; return v, ok }))
		}
		fk := row{k.driver, k.c, ""}
		var floors []float64
		for _, b := range builds {
			floors = append(floors, values(samples[b.name], func(r *result) (float64, bool) { v, ok := r.floor[fk]; return v, ok })...)
		}
		if k.mode != "inbox" || len(floors) == 0 {
			line += "\t"
			for range builds {
				line += "\t"
			}
			fmt.Fprintln(tw, line+"\t")
			continue
		}
		line += "\t" + spread(floors)
		for _, b := range builds {
			// Per run: its inbox ratio less the floor it measured in
			// the same rounds.
			d := values(samples[b.name], func(r *result) (float64, bool) {
				v, ok := r.ratio[k]
				f, fok := r.floor[fk]
				return v - f, ok && fok
			})
			line += "\t" + signedSpread(d)
		}
		fmt.Fprintln(tw, line+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nallocations per message, one at a time (median of the runs)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head = "driver\tmode"
	for _, b := range builds {
		head += "\t" + b.name
	}
	fmt.Fprintln(tw, head+"\t")
	var seen []row
	for _, k := range first[0].order {
		a := row{k.driver, 0, k.mode}
		if slices.Contains(seen, a) {
			continue
		}
		seen = append(seen, a)
		line := k.driver + "\t" + k.mode
		for _, b := range builds {
			v := values(samples[b.name], func(r *result) (float64, bool) { v, ok := r.allocs[a]; return v, ok })
			if len(v) == 0 {
				line += "\t-"
				continue
			}
			line += fmt.Sprintf("\t%.0f", median(v))
		}
		fmt.Fprintln(tw, line+"\t")
	}
	return tw.Flush()
}

func values(rs []*result, get func(*result) (float64, bool)) []float64 {
	var out []float64
	for _, r := range rs {
		if v, ok := get(r); ok {
			out = append(out, v)
		}
	}
	return out
}

func spread(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f (%.2f to %.2f)", median(xs), slices.Min(xs), slices.Max(xs))
}

func signedSpread(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.2f (%+.2f to %+.2f)", median(xs), slices.Min(xs), slices.Max(xs))
}

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

func loadValues(loads []string) []float64 {
	var out []float64
	for _, l := range loads {
		if v, err := strconv.ParseFloat(l, 64); err == nil {
			out = append(out, v)
		}
	}
	return out
}

func medianString(loads []string) string {
	v := loadValues(loads)
	if len(v) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", median(v))
}

func maxString(loads []string) string {
	v := loadValues(loads)
	if len(v) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", slices.Max(v))
}
