package stream

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/observe"
)

// Counts records what routers did: every outcome of the inbox, the
// retries of the Retry middleware, the nacks the broker got, the log lines
// the routers wrote, and the first claim that succeeded after a Mark. One
// Counts may serve several routers. It is an observe.Observer.
type Counts struct {
	Deliveries atomic.Int64 // messages that reached the router's handler, redeliveries included
	Retries    atomic.Int64 // attempts the Retry middleware repeated
	Nacks      atomic.Int64 // messages the router nacked (the retries gave up)
	LogLines   atomic.Int64 // router log lines at info level and above
	DebugLines atomic.Int64 // at debug and trace levels
	Transient  atomic.Int64 // attempts the inbox failed with an error inbox.IsTransient reports
	Permanent  atomic.Int64 // attempts it failed with an error inbox.IsPermanent reports
	Neither    atomic.Int64 // attempts it failed with an error of neither kind (the handler's own)

	mu       sync.Mutex
	outcomes map[observe.Outcome]int64
	mark     time.Time
	firstOK  time.Time // the end of the first claim that started after mark and succeeded
	okSince  int64     // successful claims since mark
	neither  []string  // the errors Neither counted
}

// NeitherErrors returns the errors of the attempts Neither counts.
func (c *Counts) NeitherErrors() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.neither...)
}

// NewCounts returns empty counts.
func NewCounts() *Counts { return &Counts{outcomes: map[observe.Outcome]int64{}} }

// Start implements observe.Observer.
func (c *Counts) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(ob observe.Observation) {
		switch {
		case inbox.IsTransient(ob.Err):
			c.Transient.Add(1)
		case inbox.IsPermanent(ob.Err):
			c.Permanent.Add(1)
		case ob.Err != nil:
			c.Neither.Add(1)
			c.mu.Lock()
			c.neither = append(c.neither, ob.Err.Error())
			c.mu.Unlock()
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.outcomes[ob.Outcome]++
		claimed := ob.Outcome == observe.Processed || ob.Outcome == observe.Duplicate
		if claimed && !c.mark.IsZero() && ob.ClaimStart.After(c.mark) {
			c.okSince++
			if end := ob.ClaimStart.Add(ob.ClaimDuration); c.firstOK.IsZero() || end.Before(c.firstOK) {
				c.firstOK = end
			}
		}
	}
}

// Mark remembers at as the moment a fault began (a kill): FirstClaim then
// measures from there.
func (c *Counts) Mark(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mark, c.firstOK, c.okSince = at, time.Time{}, 0
}

// FirstClaim returns how long after the mark the first claim that started
// after it succeeded, and false while none has.
func (c *Counts) FirstClaim() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.firstOK.IsZero() {
		return 0, false
	}
	return c.firstOK.Sub(c.mark), true
}

// ClaimedSinceMark is the number of successful claims that started after
// the mark.
func (c *Counts) ClaimedSinceMark() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.okSince
}

// Snapshot is Counts at one moment.
type Snapshot struct {
	At                                        time.Time
	Deliveries, Retries, Nacks, LogLines      int64
	Processed, Duplicates, ClaimFailed        int64
	CommitFailed, RolledBack, InFlight, Other int64
}

// Snapshot copies the counts.
func (c *Counts) Snapshot() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Snapshot{
		At: time.Now(), Deliveries: c.Deliveries.Load(), Retries: c.Retries.Load(), Nacks: c.Nacks.Load(), LogLines: c.LogLines.Load(),
	}
	for o, n := range c.outcomes {
		switch o {
		case observe.Processed:
			s.Processed += n
		case observe.Duplicate:
			s.Duplicates += n
		case observe.ClaimFailed:
			s.ClaimFailed += n
		case observe.CommitFailed:
			s.CommitFailed += n
		case observe.RolledBack:
			s.RolledBack += n
		case observe.InFlight:
			s.InFlight += n
		default:
			s.Other += n
		}
	}
	return s
}

// Attempts is the number of times a message reached the inbox.
func (s Snapshot) Attempts() int64 {
	return s.Processed + s.Duplicates + s.ClaimFailed + s.CommitFailed + s.RolledBack + s.InFlight + s.Other
}

// Sub returns what happened between o and s.
func (s Snapshot) Sub(o Snapshot) Snapshot {
	return Snapshot{
		At: s.At, Deliveries: s.Deliveries - o.Deliveries, Retries: s.Retries - o.Retries, Nacks: s.Nacks - o.Nacks,
		LogLines: s.LogLines - o.LogLines, Processed: s.Processed - o.Processed, Duplicates: s.Duplicates - o.Duplicates,
		ClaimFailed: s.ClaimFailed - o.ClaimFailed, CommitFailed: s.CommitFailed - o.CommitFailed,
		RolledBack: s.RolledBack - o.RolledBack, InFlight: s.InFlight - o.InFlight, Other: s.Other - o.Other,
	}
}

// Logger returns a router logger that counts its lines and writes none.
func (c *Counts) Logger() watermill.LoggerAdapter { return countingLogger{c: c} }

type countingLogger struct {
	c      *Counts
	fields watermill.LogFields
}

func (l countingLogger) Error(string, error, watermill.LogFields) { l.c.LogLines.Add(1) }
func (l countingLogger) Info(string, watermill.LogFields)         { l.c.LogLines.Add(1) }
func (l countingLogger) Debug(string, watermill.LogFields)        { l.c.DebugLines.Add(1) }
func (l countingLogger) Trace(string, watermill.LogFields)        { l.c.DebugLines.Add(1) }
func (l countingLogger) With(f watermill.LogFields) watermill.LoggerAdapter {
	return countingLogger{c: l.c, fields: l.fields.Add(f)}
}
