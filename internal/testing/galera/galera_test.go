package galera_test

import (
	"testing"
	"time"

	"github.com/watermill-inbox/inbox/internal/testing/dbserver"
)

// One cluster serves every case: starting one takes seconds.
func TestGalera(t *testing.T) {
	t0 := time.Now()
	cluster := dbserver.StartGalera(t)
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
	t.Logf("the cluster started in %s: data directory installed in %s, first node bootstrapped in %s, the two others joined in %s",
		r(time.Since(t0)), r(cluster.Installed), r(cluster.Bootstrapped), r(cluster.Joined))
	t.Run("node killed mid-stream", func(t *testing.T) { testNodeKilled(t, cluster) })
	t.Run("cost", func(t *testing.T) { testCost(t, cluster) })
}
