//lint:file-ignore SA4006 docs/operations.md's snippets show the calls without their error checks, which the tests add after them

package docs_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/otelinbox"
	"github.com/watermill-inbox/inbox/prommetrics"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// docs/operations.md's two observers on one middleware. The only test of
// this package on prometheus.DefaultRegisterer.
func TestOperationsObservers(t *testing.T) {
	t.Parallel()
	store, err := sqlinbox.New(testdb.SQLite(t), sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)

	metrics, err := prommetrics.New(nil, "") // prometheus.DefaultRegisterer, names watermill_inbox_*
	mw, err := inbox.NewMiddleware(inbox.Config{
		Store:    store,
		Observer: observe.Join(metrics, otelinbox.New(otelinbox.Config{})),
	})

	require.NoError(t, err)
	require.NotNil(t, mw)
}

// docs/operations.md's calls that export what the alerts read.
func TestOperationsAlertInputs(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	reg, retention := prometheus.NewRegistry(), 14*24*time.Hour

	metrics, err := prommetrics.New(reg, "") // messages and their outcomes
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Observer: metrics})
	err = metrics.WatchOldest(store)                                                                           // WatermillInboxPurgeStopped, WatermillInboxTableUnreadable
	p, err := purge.New(store, purge.Config{Retention: retention, OnRound: metrics.PurgeRound(store.Table())}) // WatermillInboxPurgeFailing

	require.NoError(t, err)
	require.NotNil(t, mw)
	_, err = p.PurgeOnce(context.Background())
	require.NoError(t, err)
	families, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	require.Contains(t, names, "watermill_inbox_oldest_row_up")
	require.Contains(t, names, "watermill_inbox_purge_rounds_total")
}

// docs/operations.md's rules written from Go under another namespace.
func TestOperationsRulesFile(t *testing.T) {
	t.Chdir(t.TempDir())

	rules := strings.ReplaceAll(prommetrics.Rules, prommetrics.DefaultNamespace, "shop") // if New got "shop"
	err := os.WriteFile("watermill-inbox-rules.yml", []byte(rules), 0o644)

	require.NoError(t, err)
	b, err := os.ReadFile("watermill-inbox-rules.yml")
	require.NoError(t, err)
	require.Contains(t, string(b), "shop_messages_total")
	require.NotContains(t, string(b), "watermill_inbox")
}
