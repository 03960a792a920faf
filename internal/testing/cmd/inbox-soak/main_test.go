package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
)

// The soak at test size: every kind of fault must have happened at least
// once, and the database must show exactly one effect per event.
func TestSoak(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	res, f, err := run(context.Background(), options{
		deliveries: 3_000, dupRatio: 0.3, partitions: 8, members: 3, dsn: testdb.PostgresDSN(),
		faultEvery: 150, errRate: 0.01, panicRate: 0.005,
	}, &out)
	require.NoError(t, err, out.String())
	t.Logf("\n%s", out.String())

	require.Equal(t, 900, res.duplicates)
	require.Zero(t, res.violations(), out.String())
	require.Equal(t, int64(res.unique), res.effects)
	for name, n := range map[string]int64{
		"crashes after commit": f.crashes.Load(), "members left": f.left.Load(), "members joined": f.joined.Load(),
		"pg_terminate_backend rounds": f.terminations.Load(), "proxy cuts": f.proxyCuts.Load(),
		"handler errors": f.handlerErrors.Load(), "handler panics": f.panics.Load(),
	} {
		require.Positive(t, n, "no %s were injected:\n%s", name, out.String())
	}
	require.Positive(t, res.outcomes["duplicate"], "no duplicate reached the inbox")
}
