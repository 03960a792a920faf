package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
)

// A short run: the program works end to end and prints its table. Its
// numbers mean nothing at this length.
func TestSmoke(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(context.Background(), options{dsn: testdb.MySQLDSN(), pgDSN: testdb.PostgresDSN(), rows: 200, producers: 2, duration: 300 * time.Millisecond, rounds: 2, readCommitted: true, out: &out})
	require.NoError(t, err, out.String())
	for _, want := range []string{"batch 1 (before)", "batch 100, RelaySubscriber", "PostgreSQL v4", "drain 200 rows", "p99 write to broker", "over v4 queue, batch 1 (before), per round"} {
		require.Contains(t, out.String(), want)
	}
	t.Log(out.String())
}
