package inbox

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Defaults of [BackoffConfig].
const (
	DefaultBackoffInitialInterval = 100 * time.Millisecond
	DefaultBackoffMaxInterval     = 2 * time.Second
	DefaultBackoffLogInterval     = 10 * time.Second
)

// BackoffConfig configures [NewBackoff].
type BackoffConfig struct {
	// InitialInterval is the wait after a message's first transient
	// failure; each further failure doubles it, up to MaxInterval, give or
	// take a fifth so that replicas spread out. Defaults to
	// [DefaultBackoffInitialInterval].
	InitialInterval time.Duration

	// MaxInterval caps the wait, and so how long after the database's
	// return a message waits at most. Defaults to
	// [DefaultBackoffMaxInterval].
	MaxInterval time.Duration

	// LogInterval is the least time between two lines about transient
	// failures: while they last, one line per LogInterval with how many
	// attempts failed since the last line, then one when an attempt
	// succeeds again. Defaults to [DefaultBackoffLogInterval].
	LogInterval time.Duration
}

func (c *BackoffConfig) setDefaults() {
	if c.InitialInterval == 0 {
		c.InitialInterval = DefaultBackoffInitialInterval
	}
	if c.MaxInterval == 0 {
		c.MaxInterval = max(DefaultBackoffMaxInterval, c.InitialInterval)
	}
	if c.LogInterval == 0 {
		c.LogInterval = DefaultBackoffLogInterval
	}
}

func (c BackoffConfig) validate() error {
	if c.InitialInterval < 0 || c.MaxInterval < 0 || c.LogInterval < 0 {
		return errors.New("InitialInterval, MaxInterval and LogInterval must not be negative")
	}
	if c.MaxInterval < c.InitialInterval {
		return fmt.Errorf("MaxInterval (%s) is shorter than InitialInterval (%s)", c.MaxInterval, c.InitialInterval)
	}
	return nil
}

// NewBackoff returns a middleware that waits out what [IsTransient]
// reports (the database down or restarting, a lost connection, another copy
// of the event in flight, a handler's error marked [Transient]): it calls
// the handler again in place, after a wait that doubles up to a cap, until
// the attempt succeeds or fails otherwise. A message is never dropped for
// it, the broker sees no nack (a nack is redelivered at once by many
// brokers: a hot loop), and the router logs nothing; the middleware logs
// at most one line per [BackoffConfig.LogInterval] while failures last, and
// one when they end. When the message's context ends (the router closing)
// it returns the error, for the broker to redeliver.
//
// Put it between Recoverer and the inbox, as the README's stack does, so
// that every attempt opens a new transaction
// (docs/wiring.md#retries-and-the-poison-queue). nil logger is
// [watermill.NopLogger].
func NewBackoff(config BackoffConfig, logger watermill.LoggerAdapter) (message.HandlerMiddleware, error) {
	config.setDefaults()
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("inbox: invalid backoff config: %w", err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	b := &backoff{config: config, log: outageLog{logger: logger, interval: config.LogInterval}}
	return b.middleware, nil
}

type backoff struct {
	config BackoffConfig
	log    outageLog
}

func (b *backoff) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		wait := b.config.InitialInterval
		for {
			produced, err := h(msg)
			if !IsTransient(err) {
				b.log.over()
				return produced, err
			}
			b.log.failed(err)
			ctx := msg.Context()
			timer := time.NewTimer(jitter(wait))
			select {
			case <-ctx.Done():
				timer.Stop()
				return produced, err
			case <-timer.C:
			}
			wait = min(2*wait, b.config.MaxInterval)
		}
	}
}

// jitter spreads d by a fifth either way.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

// outageLog writes the lines of one [NewBackoff] middleware: the first
// transient failure at once, then at most one line per interval while they
// go on, and one when an attempt gets through again.
type outageLog struct {
	logger   watermill.LoggerAdapter
	interval time.Duration
	what     string // what fails; "" for transient failures

	failing  atomic.Bool // read without the lock by every attempt that gets through
	mu       sync.Mutex
	since    time.Time // the first failure of the current run of failures
	last     time.Time // the last line about failures
	unlogged int64     // failures since the last line
	total    int64     // failures of the current run
	logged   bool      // the current run has had a line
}

func (o *outageLog) failed(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	if !o.failing.Load() {
		o.failing.Store(true)
		o.since, o.total, o.logged = now, 0, false
	}
	o.unlogged++
	o.total++
	if !o.last.IsZero() && now.Sub(o.last) < o.interval {
		return
	}
	what := o.what
	if what == "" {
		what = "transient failures, waited out with backoff, every message kept"
	}
	o.logger.Error(fmt.Sprintf("Inbox: %s; at most one line per %s", what, o.interval), err, watermill.LogFields{
		"failed_attempts": o.unlogged, "since": o.since.Format(time.RFC3339),
	})
	o.last, o.unlogged, o.logged = now, 0, true
}

// over ends a run of failures: an attempt got through.
func (o *outageLog) over() {
	if !o.failing.Load() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.failing.Load() {
		return
	}
	o.failing.Store(false)
	if o.logged {
		line := "Inbox: transient failures over"
		if o.what != "" {
			line = "Inbox: over: " + o.what
		}
		o.logger.Info(line, watermill.LogFields{
			"lasted": time.Since(o.since).Round(time.Millisecond).String(), "failed_attempts": o.total,
		})
	}
}
