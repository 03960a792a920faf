package bench

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
)

// Result is one timed run of a handler.
type Result struct {
	Msgs      int64
	Errors    int64
	FirstErr  error
	Elapsed   time.Duration
	Latencies []time.Duration // sorted
}

// Rate returns messages handled per second.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Msgs) / r.Elapsed.Seconds()
}

// Percentile returns the latency below which fraction p of messages fall.
func (r Result) Percentile(p float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	i := int(p * float64(len(r.Latencies)-1))
	return r.Latencies[i]
}

// Merge adds o's messages and latencies to r.
func (r Result) Merge(o Result) Result {
	r.Msgs += o.Msgs
	r.Errors += o.Errors
	if r.FirstErr == nil {
		r.FirstErr = o.FirstErr
	}
	r.Elapsed += o.Elapsed
	r.Latencies = append(r.Latencies, o.Latencies...)
	slices.Sort(r.Latencies)
	return r
}

// Messages makes the message each worker handles next.
type Messages func(worker int) *message.Message

// NewMessages gives every message a new event id (a random UUID, like the
// ids producers generate, so claims land all over the index).
func NewMessages() Messages {
	return func(int) *message.Message { return message.NewMessage(watermill.NewUUID(), nil) }
}

// NewTimeOrderedMessages gives every message a new UUIDv7 event id: ids
// that grow with time, so new claims land on the rightmost pages of the key
// index instead of all over it.
func NewTimeOrderedMessages() Messages {
	return func(int) *message.Message { return message.NewMessage(uuid.Must(uuid.NewV7()).String(), nil) }
}

// Duplicates redelivers events whose ids are among ids, picked at random.
func Duplicates(ids []string) Messages {
	return func(int) *message.Message {
		return message.NewMessage(ids[rand.IntN(len(ids))], nil)
	}
}

// PrefilledID is the event id of row i of a prefilled inbox: md5(i) shaped
// as a UUID, random over the index like real ids and computable on both
// sides (PostgreSQL: md5(i::text)::uuid::text).
func PrefilledID(i int64) string {
	sum := md5.Sum(strconv.AppendInt(nil, i, 10))
	h := hex.EncodeToString(sum[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// PrefilledDuplicates redelivers random events among rows 1..n of a
// prefilled inbox.
func PrefilledDuplicates(n int64) Messages {
	return func(int) *message.Message {
		return message.NewMessage(PrefilledID(1+rand.Int64N(n)), nil)
	}
}

// Run calls h from workers goroutines for d and measures every call. A
// message the handler fails is counted as an error, not retried.
func Run(ctx context.Context, h message.HandlerFunc, workers int, d time.Duration, next Messages) Result {
	return runTimed(ctx, workers, 1, d, func(w int) func() error {
		msg := next(w)
		return func() error {
			_, err := h(msg)
			return err
		}
	})
}

// runTimed runs, from workers goroutines for d, the calls prepare makes
// (outside the timing), each of size messages, and measures every call.
func runTimed(ctx context.Context, workers, size int, d time.Duration, prepare func(worker int) func() error) Result {
	type part struct {
		msgs, errs int64
		first      error
		lat        []time.Duration
	}
	parts := make([]part, workers)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			p := &parts[w]
			p.lat = make([]time.Duration, 0, 4096)
			for ctx.Err() == nil {
				call := prepare(w)
				t0 := time.Now()
				err := call()
				t1 := time.Now()
				for range size {
					p.lat = append(p.lat, t1.Sub(t0))
				}
				if err != nil {
					p.errs += int64(size)
					if p.first == nil {
						p.first = err
					}
				} else {
					p.msgs += int64(size)
				}
				if t1.After(deadline) {
					return
				}
			}
		})
	}
	wg.Wait()
	r := Result{Elapsed: time.Since(start)}
	for _, p := range parts {
		r.Msgs += p.msgs
		r.Errors += p.errs
		if r.FirstErr == nil {
			r.FirstErr = p.first
		}
		r.Latencies = append(r.Latencies, p.lat...)
	}
	slices.Sort(r.Latencies)
	return r
}

// RunN calls h n times, one at a time, and returns the first error.
func RunN(h message.HandlerFunc, n int, next Messages) error {
	for range n {
		if _, err := h(next(0)); err != nil {
			return err
		}
	}
	return nil
}
