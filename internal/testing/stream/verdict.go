package stream

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Verdict is what the database holds after a stream: effects per event,
// and inbox rows.
type Verdict struct {
	Events    int // unique events published
	Effects   int // effect rows
	InboxRows int
	Missing   int // events without an effect
	Doubled   int // events with more than one
	Unknown   int // effects of no published event
}

// Check reads the verdict of a stream of events (ids EventID(0..events-1))
// from tg's tables.
func Check(t testing.TB, tg *Target, events int) Verdict {
	t.Helper()
	v, err := Count(context.Background(), tg, events)
	require.NoError(t, err)
	return v
}

// Count is Check for programs.
func Count(ctx context.Context, tg *Target, events int) (Verdict, error) {
	v := Verdict{Events: events}
	rows, err := tg.DB.QueryContext(ctx, `SELECT event_id, count(*) FROM `+tg.Effects+` GROUP BY event_id`)
	if err != nil {
		return v, err
	}
	defer rows.Close()
	counts := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return v, err
		}
		counts[id] = n
		v.Effects += n
	}
	if err := rows.Err(); err != nil {
		return v, err
	}
	for i := range events {
		switch n := counts[EventID(i)]; {
		case n == 0:
			v.Missing++
		case n > 1:
			v.Doubled++
		}
		delete(counts, EventID(i))
	}
	v.Unknown = len(counts)
	return v, tg.DB.QueryRowContext(ctx, `SELECT count(*) FROM `+tg.Inbox).Scan(&v.InboxRows)
}

// RequireExactlyOnce fails unless every event has exactly one effect, and
// the inbox one row per event.
func (v Verdict) RequireExactlyOnce(t testing.TB) {
	t.Helper()
	require.Equal(t, Verdict{Events: v.Events, Effects: v.Events, InboxRows: v.Events}, v, "effects per event")
}

// String prints the verdict on one line.
func (v Verdict) String() string {
	return fmt.Sprintf("%d events: %d effects, %d inbox rows, %d missing, %d doubled, %d unknown",
		v.Events, v.Effects, v.InboxRows, v.Missing, v.Doubled, v.Unknown)
}
