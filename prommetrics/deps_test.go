package prommetrics_test

import (
	"testing"

	"github.com/watermill-inbox/inbox/internal/depstest"
)

// Metrics need no store: a program exporting them links neither the purge
// nor a store, nor any database driver.
func TestLinksNoStore(t *testing.T) {
	t.Parallel()
	depstest.Forbid(t, "github.com/watermill-inbox/inbox/prommetrics", append([]string{
		"github.com/watermill-inbox/inbox/purge",
		"github.com/watermill-inbox/inbox/sqlinbox",
		"github.com/watermill-inbox/inbox/pgxinbox",
	}, depstest.Drivers...)...)
}
