package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
)

// TestMain lets the test binary be the soak's consumer child too.
func TestMain(m *testing.M) {
	if raw := os.Getenv(childEnv); raw != "" {
		fmt.Fprintln(os.Stderr, "inbox-soak consumer:", runChild(raw))
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// The soak at test size, on every database and store: every kind of fault
// the database can have must have happened at least once, a consumer
// process SIGKILLed among them, and the database must show exactly one
// effect per event.
func TestSoak(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ driver, dsn string }{
		{"pgx-stdlib", testdb.PostgresDSN()},
		{"pgx", testdb.PostgresDSN()},
		{"mysql", testdb.MySQLDSN()},
		{"sqlite", ""},
	} {
		t.Run(c.driver, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			res, f, err := run(context.Background(), options{
				deliveries: 3_000, dupRatio: 0.3, partitions: 8, members: 3, driver: c.driver, dsn: c.dsn, children: true,
				faultEvery: 100, errRate: 0.01, panicRate: 0.005,
			}, &out)
			require.NoError(t, err, out.String())
			t.Logf("\n%s", out.String())

			require.Equal(t, 900, res.duplicates)
			require.Zero(t, res.violations(), out.String())
			require.Equal(t, int64(res.unique), res.effects)
			injected := map[string]int64{
				"crashes after commit": f.crashes.Load(), "members left": f.left.Load(), "members joined": f.joined.Load(),
				"process kills": f.processKills.Load(), "handler errors": f.handlerErrors.Load(), "handler panics": f.panics.Load(),
			}
			if c.driver != "sqlite" { // no server, no connections to kill
				injected["rounds of connections killed"] = f.terminations.Load()
				injected["proxy cuts"] = f.proxyCuts.Load()
			}
			for name, n := range injected {
				require.Positive(t, n, "no %s were injected:\n%s", name, out.String())
			}
			require.Positive(t, res.outcomes["duplicate"], "no duplicate reached the inbox")
		})
	}
}
