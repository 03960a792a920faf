package failover_test

import (
	"fmt"
	"time"
)

func (r failover) String() string {
	mode := "asynchronous"
	if r.sync {
		mode = "synchronous"
	}
	d := r.during
	return fmt.Sprintf("%s replication: %d events, %d deliveries published; %d handled (redeliveries included), %d duplicates skipped, %d effects; "+
		"%d events lost (replicas %v bytes behind at the kill); bootstrap %s, new leader %s after the kill, first claim on it %s after the kill; "+
		"meanwhile: %d attempts, %d claims failed, %d commits failed, %d rolled back, %d retries, %d nacks, %d log lines (%.1f/s)",
		mode, r.stream.Events, r.stream.Deliveries, r.total.Deliveries, r.total.Duplicates, r.verdict.Effects,
		r.verdict.Missing, r.lagBytes, round(r.bootstrap), round(r.promoted), round(r.firstClaim),
		d.Attempts(), d.ClaimFailed, d.CommitFailed, d.RolledBack, d.Retries, d.Nacks, d.LogLines, float64(d.LogLines)/r.firstClaim.Seconds())
}

func round(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
