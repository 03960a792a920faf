package vitess_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// event is one event of a stream: its id and the customer its effect
// belongs to.
type event struct {
	id       string
	customer int64
}

// newEvents returns n events (UUIDv7 ids) of customers 1 to customers.
func newEvents(n, customers int) []event {
	out := make([]event, n)
	for i := range out {
		out[i] = event{id: uuid.Must(uuid.NewV7()).String(), customer: int64(1 + rand.IntN(customers))}
	}
	return out
}

// tally counts what the deliveries of a stream did.
type tally struct {
	deliveries, attempts, committed, duplicates, inFlight atomic.Int64
	mu                                                    sync.Mutex
	failed                                                map[string]error // event id: the handler's error
}

// requireNoFailure fails the test with the first few failures, if any.
func (c *tally) requireNoFailure(t *testing.T) {
	t.Helper()
	if len(c.failed) == 0 {
		return
	}
	var some []string
	for id, err := range c.failed {
		if len(some) == 3 {
			break
		}
		some = append(some, id+": "+err.Error())
	}
	require.FailNow(t, fmt.Sprintf("%d events failed, among them:\n%s", len(c.failed), strings.Join(some, "\n")))
}

func (c *tally) String() string {
	return fmt.Sprintf("%d deliveries in %d attempts: %d committed, %d duplicates acked, %d claims in flight retried, %d events failed",
		c.deliveries.Load(), c.attempts.Load(), c.committed.Load(), c.duplicates.Load(), c.inFlight.Load(), len(c.failed))
}

// deliver delivers every event copies times, each copy by one of workers
// goroutines in random order, so that copies of an event race, through the
// inbox middleware, whose Config.ShardKey is the customer when the table has
// a shard key column: the handler writes its effect in the claim's
// transaction. A claim in flight is retried, as a redelivery would; a copy
// whose effect or commit fails is given up (nacked to a poison queue) with
// its error recorded.
func deliver(t *testing.T, store *sqlinbox.Store, db *sql.DB, effects string, events []event, copies, workers int) *tally {
	t.Helper()
	type copyOf struct {
		e event
		n int
	}
	work := make([]copyOf, 0, len(events)*copies)
	for _, e := range events {
		for n := range copies {
			work = append(work, copyOf{e, n})
		}
	}
	rand.Shuffle(len(work), func(i, j int) { work[i], work[j] = work[j], work[i] })
	c := &tally{failed: map[string]error{}}
	queue := make(chan copyOf)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	config := inbox.Config{Store: store, Consumer: "billing"}
	if store.ShardKeyColumn() != "" {
		config.ShardKey = func(msg *message.Message) (string, error) { return msg.Metadata.Get("customer_id"), nil }
	}
	mw, err := inbox.NewMiddleware(config)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for w := range queue {
				c.deliveries.Add(1)
				if err := deliverOne(ctx, mw, effects, w.e, w.n, c); err != nil {
					c.mu.Lock()
					c.failed[w.e.id] = err
					c.mu.Unlock()
				}
			}
		})
	}
	for _, w := range work {
		queue <- w
	}
	close(queue)
	wg.Wait()
	require.NoError(t, ctx.Err(), "the stream did not end in time: %s", c)
	return c
}

// deliverOne handles one copy until it is committed or acked as a
// duplicate; a failed effect or commit is returned.
func deliverOne(ctx context.Context, mw message.HandlerMiddleware, effects string, e event, copyN int, c *tally) error {
	for {
		c.attempts.Add(1)
		ran := false
		h := mw(func(msg *message.Message) ([]*message.Message, error) {
			ran = true
			tx, ok := inbox.TxFromContext(msg.Context())
			if !ok {
				return nil, inbox.ErrNotInInbox
			}
			_, err := tx.ExecContext(msg.Context(), "INSERT INTO "+effects+" (customer_id, event_id, copy) VALUES (?, ?, ?)", e.customer, e.id, copyN)
			return nil, err
		})
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, e.id)
		msg.Metadata.Set("customer_id", strconv.FormatInt(e.customer, 10))
		msg.SetContext(ctx)
		_, err := h(msg)
		switch {
		case errors.Is(err, inbox.ErrInFlight):
			c.inFlight.Add(1)
			continue
		case err != nil:
			return err
		case ran:
			c.committed.Add(1)
		default:
			c.duplicates.Add(1)
		}
		return nil
	}
}
