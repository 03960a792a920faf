package conformancetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/observe"
)

// batchCases are the batch consumer's cases (inbox.BatchConsumer), run on
// every target by [Run].
var batchCases = []struct {
	name string
	fn   func(t *testing.T, target Target)
}{
	{"BatchDuplicateInsideOneBatch", testBatchDuplicateInsideOneBatch},
	{"BatchRacingBatches", testBatchRacingBatches},
	{"BatchRacingPerMessage", testBatchRacingPerMessage},
	{"BatchPoisonMessage", testBatchPoisonMessage},
	{"BatchRedeliveredAfterCommit", testBatchRedeliveredAfterCommit},
}

// batchConsumer is a batch consumer on the bundle's table whose handler
// writes each message's effect, counts its calls and fails as fail says
// (nil: never).
func (b *bundle) batchConsumer(t testing.TB, cfg inbox.BatchConfig, fail func(msgs []*message.Message) error) (*inbox.BatchConsumer, *batchCalls) {
	t.Helper()
	if cfg.Store == nil {
		if b.target.Native != nil {
			store, _, err := b.target.Native.Store(t, b.config)
			require.NoError(t, err)
			cfg.Store = b.timed(store)
		} else {
			cfg.Store = b.timed(b.store)
		}
	}
	if cfg.Consumer == "" {
		cfg.Consumer = "batch"
	}
	calls := &batchCalls{}
	c, err := inbox.NewBatchConsumer(cfg, func(ctx context.Context, msgs []*message.Message) error {
		calls.add(msgs)
		for _, msg := range msgs {
			if err := b.writeEffect(msg); err != nil {
				return err
			}
		}
		if fail != nil {
			return fail(msgs)
		}
		return nil
	})
	require.NoError(t, err)
	return c, calls
}

// batchCalls records the event ids of every handler call.
type batchCalls struct {
	mu    sync.Mutex
	calls [][]string
}

func (c *batchCalls) add(msgs []*message.Message) {
	ids := make([]string, len(msgs))
	for i, msg := range msgs {
		ids[i], _, _ = inbox.EventIDFromContext(msg.Context())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, ids)
}

func (c *batchCalls) all() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

func batchMsgs(ids ...string) []*message.Message {
	msgs := make([]*message.Message, len(ids))
	for i, id := range ids {
		msgs[i] = newMsg(id)
	}
	return msgs
}

// acked reports, per message, whether it was acked (true) or nacked.
func acked(t testing.TB, msgs []*message.Message) []bool {
	t.Helper()
	out := make([]bool, len(msgs))
	for i, msg := range msgs {
		select {
		case <-msg.Acked():
			out[i] = true
		case <-msg.Nacked():
		default:
			t.Fatalf("message %d neither acked nor nacked", i)
		}
	}
	return out
}

// A batch holding an event twice, and one processed before, calls the
// handler once with the other events; every message is acked.
func testBatchDuplicateInsideOneBatch(t *testing.T, target Target) {
	b := setup(t, target)
	c, calls := b.batchConsumer(t, inbox.BatchConfig{}, nil)
	ctx := context.Background()
	require.NoError(t, c.Process(ctx, batchMsgs("e-1")))
	msgs := batchMsgs("e-2", "e-1", "e-3", "e-2", "e-4")
	require.NoError(t, c.Process(ctx, msgs))
	require.Equal(t, []bool{true, true, true, true, true}, acked(t, msgs))
	require.Equal(t, [][]string{{"e-1"}, {"e-2", "e-3", "e-4"}}, calls.all())
	require.Equal(t, once("batch", "e-1", "e-2", "e-3", "e-4"), b.effectCounts(t))
}

// Workers process batches of the same events, each in its own order, at
// once: every event has one effect, and no batch fails (no deadlock).
func testBatchRacingBatches(t *testing.T, target Target) {
	b := setup(t, target)
	const workers, events = 4, 30
	all := ids("race", events)
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		c, _ := b.batchConsumer(t, inbox.BatchConfig{}, nil)
		order := slices.Clone(all)
		for i := range order {
			order[i] = all[(i*[]int{1, 7, 11, 13}[w]+w)%events]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = c.Process(context.Background(), batchMsgs(order...))
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, once("batch", all...), b.effectCounts(t))
}

// A batch holding an event a per-message consumer of the same name is
// processing waits for it; once that commits, the batch acks the event as
// a duplicate and handles the others.
func testBatchRacingPerMessage(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "batch"})
	release, done := holdClaim(t, b, mw, "shared")
	c, calls := b.batchConsumer(t, inbox.BatchConfig{}, nil)
	msgs := batchMsgs("before", "shared", "zafter")
	out := make(chan error, 1)
	go func() { out <- c.Process(context.Background(), msgs) }()
	select {
	case err := <-out:
		t.Fatalf("the batch did not wait for the event in flight: %v", err)
	case <-time.After(200 * time.Millisecond): // bounded: it must still wait
	}
	release(nil)
	require.NoError(t, <-done)
	require.NoError(t, <-out)
	require.Equal(t, []bool{true, true, true}, acked(t, msgs))
	require.Equal(t, [][]string{{"before", "zafter"}}, calls.all())
	require.Equal(t, once("batch", "before", "shared", "zafter"), b.effectCounts(t))
}

// A message the handler fails on is isolated: the others commit, it alone
// goes to the poison topic (acked), or without one is nacked alone. A
// transient failure nacks the whole batch, poisoning nothing.
func testBatchPoisonMessage(t *testing.T, target Target) {
	b := setup(t, target)
	poison := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = poison.Close() })
	errBad := errors.New("cannot handle bad")
	failOnBad := func(msgs []*message.Message) error {
		for _, msg := range msgs {
			if id, _, _ := inbox.EventIDFromContext(msg.Context()); id == "p-bad" {
				return errBad
			}
		}
		return nil
	}
	var outcomes sync.Map
	obs := observerFunc(func(ob observe.Observation) { outcomes.Store(ob.EventID, ob.Outcome) })
	c, _ := b.batchConsumer(t, inbox.BatchConfig{PoisonPublisher: poison, PoisonTopic: "poison", Observer: obs}, failOnBad)
	all := ids("p", 7)
	msgs := batchMsgs(append(slices.Clone(all[:3]), append([]string{"p-bad"}, all[3:]...)...)...)
	require.NoError(t, c.Process(context.Background(), msgs))
	require.Equal(t, []bool{true, true, true, true, true, true, true, true}, acked(t, msgs))
	require.Equal(t, once("batch", all...), b.effectCounts(t))
	got, err := poison.Subscribe(context.Background(), "poison")
	require.NoError(t, err)
	select {
	case p := <-got:
		require.Equal(t, "p-bad", p.Metadata.Get(inbox.DefaultEventIDMetadataKey))
		require.Contains(t, p.Metadata.Get(middleware.ReasonForPoisonedKey), errBad.Error())
		p.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("nothing on the poison topic")
	}
	o, _ := outcomes.Load("p-bad")
	require.Equal(t, observe.Poisoned, o)
	o, _ = outcomes.Load("p-0")
	require.Equal(t, observe.Processed, o)

	// Without a poison publisher the message is nacked alone.
	c, _ = b.batchConsumer(t, inbox.BatchConfig{Consumer: "nopoison"}, failOnBad)
	msgs = batchMsgs("q-1", "p-bad", "q-2")
	err = c.Process(context.Background(), msgs)
	require.ErrorIs(t, err, errBad)
	require.Equal(t, []bool{true, false, true}, acked(t, msgs))

	// A transient failure is retried in place, whole, until the context
	// ends; then the batch is nacked, whole.
	backoff := inbox.BackoffConfig{InitialInterval: time.Millisecond, MaxInterval: 10 * time.Millisecond}
	c, calls := b.batchConsumer(t, inbox.BatchConfig{Consumer: "transient", PoisonPublisher: poison, PoisonTopic: "poison", Backoff: backoff}, func([]*message.Message) error {
		return fmt.Errorf("down: %w", inbox.ErrInFlight)
	})
	msgs = batchMsgs("t-1", "t-2", "t-3")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	require.Error(t, c.Process(ctx, msgs))
	require.Equal(t, []bool{false, false, false}, acked(t, msgs))
	require.Greater(t, len(calls.all()), 1, "retried in place")
	for _, call := range calls.all() {
		require.Len(t, call, 3, "a transient failure is not split")
	}
}

// A batch redelivered after its commit (the process died before its acks,
// or its acks were lost) is all duplicates: acked without the handler.
func testBatchRedeliveredAfterCommit(t *testing.T, target Target) {
	b := setup(t, target)
	c, calls := b.batchConsumer(t, inbox.BatchConfig{}, nil)
	all := ids("r", 5)
	require.NoError(t, c.Process(context.Background(), batchMsgs(all...)))
	// A consumer of its own, as after a restart.
	again, againCalls := b.batchConsumer(t, inbox.BatchConfig{}, nil)
	msgs := batchMsgs(all...)
	require.NoError(t, again.Process(context.Background(), msgs))
	require.Equal(t, []bool{true, true, true, true, true}, acked(t, msgs))
	require.Len(t, calls.all(), 1)
	require.Empty(t, againCalls.all())
	require.Equal(t, once("batch", all...), b.effectCounts(t))
}

// observerFunc observes each message's end.
type observerFunc func(observe.Observation)

func (f observerFunc) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, f
}
