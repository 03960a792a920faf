//go:build !linux

package bench

import "time"

// waiter sleeps with Go's timers, which may oversleep short durations (up
// to a millisecond where the runtime's poller waits in milliseconds).
type waiter struct{}

func newWaiter() (*waiter, error) { return &waiter{}, nil }

func (*waiter) wait(d time.Duration) error {
	time.Sleep(d)
	return nil
}

func (*waiter) close() {}
