package inbox

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// The memory of which handler received an event keeps the last fixedEvents
// events: within it a second handler name is told the first, beyond it the
// event is forgotten, and the memory stays bounded.
func TestReceivedByIsBounded(t *testing.T) {
	t.Parallel()
	var r receivedBy
	for i := range fixedEvents + 1 {
		require.Equal(t, "invoicing", r.record(strconv.Itoa(i), "invoicing"))
	}
	require.Len(t, r.handler, fixedEvents)
	require.Equal(t, "invoicing", r.record(strconv.Itoa(fixedEvents), "analytics"), "the newest event is remembered")
	require.Equal(t, "invoicing", r.record("1", "analytics"), "and the oldest but one")
	require.Equal(t, "analytics", r.record("0", "analytics"), "the oldest was forgotten")
	require.Len(t, r.handler, fixedEvents)
}

// What the fixed consumer's memory costs a message: one lock, one lookup,
// one insert and one eviction, with the memory full.
func BenchmarkReceivedBy(b *testing.B) {
	var r receivedBy
	ids := make([]string, 2*fixedEvents)
	for i := range ids {
		ids[i] = "order-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		r.record(ids[i%len(ids)], "invoicing")
	}
}
