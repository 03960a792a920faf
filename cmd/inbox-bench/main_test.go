package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
)

// A short run of every driver and mode: the program works end to end and
// prints every table. Its numbers mean nothing at this length.
func TestSmoke(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(context.Background(), options{
		drivers: "all", dsn: testdb.PostgresDSN(), mysqlDSN: testdb.MySQLDSN(), conc: []int{2},
		duration: 20 * time.Millisecond, rounds: 1, sample: 5, dupIDs: 10, modes: "all", out: &out,
	})
	require.NoError(t, err, out.String())
	for _, want := range []string{"round trips/msg", "c=2", "bare", "inbox", "dup", "dedup", "ratio"} {
		require.Contains(t, out.String(), want)
	}
	require.NotContains(t, out.String(), "(", "a mode reported errors:\n%s", out.String())
}

// The end-to-end run through an in-process Kafka broker works too.
func TestKafkaSmoke(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(context.Background(), options{
		drivers: "pgx", dsn: testdb.PostgresDSN(), conc: []int{2},
		duration: 20 * time.Millisecond, rounds: 1, sample: 5, dupIDs: 10, modes: "bare,inbox", kafka: 20, out: &out,
	})
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "kafka, 2 partitions")
}
