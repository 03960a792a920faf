package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// durationFlag is a time.Duration that also accepts whole days ("14d"),
// the unit retentions are thought in.
type durationFlag struct{ d time.Duration }

func (f *durationFlag) String() string { return days(f.d) }

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

// days renders a duration as whole days when it is some ("14d").
func days(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return d.String()
}

// consumerRetention collects repeated -consumer-retention consumer=duration.
type consumerRetention map[string]time.Duration

func (c consumerRetention) String() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(c)) {
		parts = append(parts, k+"="+days(c[k]))
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

// retentionFlags are the purge's retention flags, which inbox check reads
// the same way.
type retentionFlags struct {
	retention   durationFlag
	perConsumer consumerRetention
}

func addRetentionFlags(fs *flag.FlagSet) *retentionFlags {
	r := &retentionFlags{perConsumer: consumerRetention{}}
	fs.Var(&r.retention, "retention", "keep rows this long after processing, e.g. 14d or 336h")
	fs.Var(r.perConsumer, "consumer-retention", "consumer=duration: another retention for one consumer (repeatable)")
	return r
}
