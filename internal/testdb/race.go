package testdb

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// RaceClaims starts racers claims of each of events event ids ("ev-0", ...)
// at once through claim, holds each won claim while the others arrive and
// wait, commits it, and checks that every id had exactly one winner. claim
// returns the commit of a won claim, or ok false for a duplicate.
func RaceClaims(t *testing.T, events, racers int, claim func(id string) (commit func() error, ok bool, err error)) {
	t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners = map[string]int{}
		start   = make(chan struct{})
	)
	for e := range events {
		id := fmt.Sprintf("ev-%d", e)
		for range racers {
			wg.Go(func() {
				<-start
				commit, ok, err := claim(id)
				if !ok || err != nil {
					require.NoError(t, err)
					return
				}
				time.Sleep(30 * time.Millisecond)
				require.NoError(t, commit())
				mu.Lock()
				winners[id]++
				mu.Unlock()
			})
		}
	}
	close(start)
	wg.Wait()
	for e := range events {
		id := fmt.Sprintf("ev-%d", e)
		require.Equal(t, 1, winners[id], id)
	}
}

// RaceDeliveries delivers copies of each of events event ids ("ev-0", ...)
// at once: copy c of an id goes through deliver(c, id), so copies can take
// different paths (stores, drivers). Every delivery must succeed; the
// caller counts what its handlers did.
func RaceDeliveries(t *testing.T, events, copies int, deliver func(copy int, id string) error) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for e := range events {
		id := fmt.Sprintf("ev-%d", e)
		for c := range copies {
			wg.Go(func() {
				<-start
				require.NoError(t, deliver(c, id), "copy %d of %s", c, id)
			})
		}
	}
	close(start)
	wg.Wait()
}
