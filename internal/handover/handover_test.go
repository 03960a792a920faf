package handover_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/handover"
)

// settlements records what became of each delivery.
type settlements struct {
	mu   sync.Mutex
	done []string
}

func (s *settlements) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.done)
}

func (s *settlements) delivery(name string) handover.Delivery {
	record := func(what string) func() error {
		return func() error {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.done = append(s.done, what+" "+name)
			return nil
		}
	}
	return handover.Delivery{Ack: record("ack"), Nack: record("nack")}
}

// A message acked or nacked settles its delivery the same way; one the
// consumer never takes is nacked; one left unsettled when the
// subscription ends is left to the broker. Each message gets a context of
// its own, ended once it is settled.
func TestDeliver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	closing := make(chan struct{})
	out := make(chan *message.Message, 3)
	var (
		s  settlements
		wg sync.WaitGroup
	)
	var failures []error
	failed := func(err error) {
		if err != nil {
			failures = append(failures, err)
		}
	}
	msgs := []*message.Message{message.NewMessage("a", nil), message.NewMessage("b", nil), message.NewMessage("c", nil)}
	for i, msg := range msgs {
		require.True(t, handover.Deliver(ctx, closing, out, msg, s.delivery(msg.UUID), &wg, failed), i)
	}
	msgs[0].Ack()
	msgs[1].Nack()
	require.Eventually(t, func() bool { return s.count() == 2 }, 10*time.Second, time.Millisecond)
	// The consumer is gone: out is full, and ctx ends.
	cancel()
	require.False(t, handover.Deliver(ctx, closing, make(chan *message.Message), message.NewMessage("d", nil), s.delivery("d"), &wg, failed))
	wg.Wait()
	require.ElementsMatch(t, []string{"ack a", "nack b", "nack d"}, s.done, "c was left to the broker")
	for _, msg := range msgs {
		require.ErrorIs(t, msg.Context().Err(), context.Canceled)
	}
	require.Empty(t, failures)
}
