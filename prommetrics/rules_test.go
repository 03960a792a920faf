package prommetrics_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/prommetrics"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The rules, their promtool unit tests and the runbooks they link to.
const (
	rulesDir    = "rules"
	runbooks    = "../docs/operations.md"
	runbookBase = "https://github.com/watermill-inbox/inbox/blob/main/docs/operations.md"
)

func promtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool checks the alerting rules and is not installed: run ./test.sh --install as root "+
		"(it installs Debian's prometheus package, which ships promtool, without starting its server)")
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
}

func TestRulesPromtool(t *testing.T) {
	t.Parallel()
	promtool(t, rulesDir, "check", "rules", "rules.yml")
	promtool(t, rulesDir, "test", "rules", "rules_test.yml")
}

// TestRulesOtherNamespace follows the documented way to use the rules with
// another namespace, replacing every "watermill_inbox": the rules and their
// unit tests still pass, so nothing depends on the default name elsewhere.
func TestRulesOtherNamespace(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, name := range []string{"rules.yml", "rules_test.yml"} {
		b, err := os.ReadFile(filepath.Join(rulesDir, name))
		require.NoError(t, err)
		renamed := strings.ReplaceAll(string(b), prommetrics.DefaultNamespace, "shop")
		require.NotContains(t, renamed, "watermill_inbox")
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(renamed), 0o600))
	}
	promtool(t, dir, "check", "rules", "rules.yml")
	promtool(t, dir, "test", "rules", "rules_test.yml")
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type testFile struct {
	Tests []struct {
		InputSeries []struct {
			Series string `yaml:"series"`
		} `yaml:"input_series"`
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func parseRules(t *testing.T, text string) []rule {
	t.Helper()
	var f ruleFile
	require.NoError(t, yaml.Unmarshal([]byte(text), &f))
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	require.NotEmpty(t, rules)
	return rules
}

func parseTests(t *testing.T, text string) testFile {
	t.Helper()
	var f testFile
	require.NoError(t, yaml.Unmarshal([]byte(text), &f))
	require.NotEmpty(t, f.Tests)
	return f
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// TestRulesRunbooksAndTests checks what promtool does not: every alert has a
// severity, a summary, a description and a runbook that exists, the runbooks
// document no alert that is gone, and the unit tests show every alert both
// firing and silent.
func TestRulesRunbooksAndTests(t *testing.T) {
	t.Parallel()
	docs := readFile(t, runbooks)
	_, section, ok := strings.Cut(docs, "\n## Alerts\n")
	require.True(t, ok, "%s has no Alerts section", runbooks)
	section, _, _ = strings.Cut(section, "\n## ")
	var documented []string
	for _, line := range strings.Split(section, "\n") {
		if name, ok := strings.CutPrefix(line, "### "); ok {
			documented = append(documented, name)
		}
	}

	tests := parseTests(t, readFile(t, filepath.Join(rulesDir, "rules_test.yml")))
	var alerts []string
	for _, r := range parseRules(t, prommetrics.Rules) {
		if r.Alert == "" {
			continue
		}
		alerts = append(alerts, r.Alert)
		require.Contains(t, []string{"critical", "warning"}, r.Labels["severity"], r.Alert)
		require.NotEmpty(t, r.Annotations["summary"], r.Alert)
		require.NotEmpty(t, r.Annotations["description"], r.Alert)
		require.Equal(t, runbookBase+"#"+strings.ToLower(r.Alert), r.Annotations["runbook_url"], r.Alert)

		var fires, silent bool
		for _, tc := range tests.Tests {
			for _, at := range tc.AlertRuleTest {
				if at.Alertname == r.Alert {
					fires = fires || len(at.ExpAlerts) > 0
					silent = silent || len(at.ExpAlerts) == 0
				}
			}
		}
		require.True(t, fires, "no unit test makes %s fire", r.Alert)
		require.True(t, silent, "no unit test keeps %s silent", r.Alert)
	}
	require.ElementsMatch(t, alerts, documented, "each alert has one runbook, a ### heading under ## Alerts in %s", runbooks)
}

// scrape maps each metric family to its labels and the values seen for each.
type scrape map[string]map[string]map[string]bool

// Labels that Prometheus adds to a scrape, and labels whose values are the
// user's names: any value is fine for them.
var (
	targetLabels = []string{"job", "instance", "pod"}
	freeLabels   = []string{"consumer", "table"}
)

// TestRulesMatchScrape drives a real middleware on SQLite and gochannel
// through every outcome, runs a purge round that succeeds and one that
// fails, watches the oldest claim, and checks that every metric, label and
// label value the rules and their unit tests use is in the scrape: renaming
// a metric, a label or an outcome without the rules fails here. It does so
// for the default namespace and for another one, with the rules renamed the
// documented way.
func TestRulesMatchScrape(t *testing.T) {
	t.Parallel()
	for _, namespace := range []string{prommetrics.DefaultNamespace, "shop"} {
		t.Run(namespace, func(t *testing.T) {
			t.Parallel()
			rename := func(s string) string { return strings.ReplaceAll(s, prommetrics.DefaultNamespace, namespace) }
			got := scrapeEveryOutcome(t, namespace)
			checkRules(t, got, parseRules(t, rename(prommetrics.Rules)))
			checkTestSeries(t, got, parseTests(t, rename(readFile(t, filepath.Join(rulesDir, "rules_test.yml")))))
		})
	}
}

// outcomes is an observe.Observer that reports each message's outcome.
type outcomes chan observe.Observation

func (o outcomes) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(ob observe.Observation) { o <- ob }
}

func (o outcomes) next(t *testing.T) observe.Observation {
	t.Helper()
	select {
	case ob := <-o:
		return ob
	case <-time.After(30 * time.Second):
		t.Fatal("no message left the inbox middleware within 30s")
		return observe.Observation{}
	}
}

func scrapeEveryOutcome(t *testing.T, namespace string) scrape {
	ctx := context.Background()
	// A short busy timeout: the in-flight case waits for it.
	dsn := "file:" + testdb.SQLiteFile(t) + "?" + url.Values{
		"_pragma": {"busy_timeout(100)", "journal_mode(WAL)"}, "_txlock": {"immediate"},
	}.Encode()
	db := testdb.Open(t, "sqlite", dsn)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite, Fingerprints: true})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	missing, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite, Table: "never_created", Fingerprints: true})
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	metrics, err := prommetrics.New(reg, namespace)
	require.NoError(t, err)
	require.NoError(t, metrics.WatchOldest(store))
	seen := make(outcomes, 16)

	pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	// Failed messages go to a poison topic instead of coming back forever.
	poison, err := middleware.PoisonQueue(pubsub, "poison")
	require.NoError(t, err)
	router.AddMiddleware(poison)
	held, release := make(chan struct{}), make(chan struct{})
	handler := func(msg *message.Message) error {
		switch msg.Metadata.Get("do") {
		case "fail":
			return errors.New("handler failed")
		case "commit": // COMMIT behind the middleware's back, so that its own fails
			tx, _ := inbox.TxFromContext(msg.Context())
			_, err := tx.ExecContext(msg.Context(), `COMMIT`)
			return err
		case "hold": // keep SQLite's write lock until released
			close(held)
			<-release
		}
		return nil
	}
	for _, c := range []struct {
		consumer string
		store    *sqlinbox.Store
		stale    inbox.StalePolicy
	}{
		{"billing", store, inbox.StaleSkip},
		{"reports", store, inbox.StaleProcess},
		{"orphan", missing, inbox.StaleSkip},
	} {
		mw, err := inbox.NewMiddleware(inbox.Config{
			Store: c.store, Consumer: c.consumer, Observer: observe.Join(metrics, seen),
			EventID:     inbox.EventIDFromMetadata("event_id"),
			Fingerprint: inbox.PayloadFingerprint,
			MaxEventAge: time.Hour, EventTime: inbox.EventTimeFromMetadata("event_time"), StaleEvents: c.stale,
		})
		require.NoError(t, err)
		router.AddConsumerHandler(c.consumer, c.consumer, pubsub, handler).AddMiddleware(mw)
	}
	go func() { _ = router.Run(ctx) }()
	t.Cleanup(func() { _ = router.Close() })
	<-router.Running()

	publish := func(topic, id, payload string, metadata ...string) {
		msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
		if id != "" {
			msg.Metadata.Set("event_id", id)
		}
		for i := 0; i+1 < len(metadata); i += 2 {
			msg.Metadata.Set(metadata[i], metadata[i+1])
		}
		require.NoError(t, pubsub.Publish(topic, msg))
	}
	old := time.Now().Add(-2 * time.Hour).Format(time.RFC3339Nano)
	for _, c := range []struct {
		topic, id, payload string
		metadata           []string
		want               observe.Outcome
	}{
		{"billing", "e1", "a", nil, observe.Processed},
		{"billing", "e1", "a", nil, observe.Duplicate},
		{"billing", "e1", "b", nil, observe.IDReused},
		{"billing", "", "a", nil, observe.MissingID},
		{"billing", "bad\x00id", "a", nil, observe.InvalidID},
		{"billing", "e2", "a", []string{"event_time", old}, observe.Stale},
		{"reports", "e2", "a", []string{"event_time", old}, observe.Processed}, // stale, processed
		{"billing", "e3", "a", []string{"do", "fail"}, observe.RolledBack},
		{"billing", "e4", "a", []string{"do", "commit"}, observe.CommitFailed},
		{"orphan", "e5", "a", nil, observe.ClaimFailed},
	} {
		publish(c.topic, c.id, c.payload, c.metadata...)
		require.Equal(t, c.want, seen.next(t).Outcome, "%s %q", c.topic, c.id)
	}
	// One copy of e6 holds the claim while another waits past the busy timeout.
	publish("reports", "e6", "a", "do", "hold")
	<-held
	publish("billing", "e6", "a")
	require.Equal(t, observe.InFlight, seen.next(t).Outcome)
	close(release)
	require.Equal(t, observe.Processed, seen.next(t).Outcome)

	// The inbox applied twice to one message: the inner one refuses it.
	twice, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "twice", Observer: observe.Join(metrics, seen)})
	require.NoError(t, err)
	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, "e7")
	_, err = twice(twice(func(*message.Message) ([]*message.Message, error) { return nil, nil }))(msg)
	require.ErrorIs(t, err, inbox.ErrMiswired)
	require.Equal(t, observe.Miswired, seen.next(t).Outcome)
	require.Equal(t, observe.RolledBack, seen.next(t).Outcome)

	// A round that is done, one that skips because it runs while the first
	// still logs, and one that fails on a table that does not exist.
	logger := &blockingLogger{logging: make(chan struct{}), release: make(chan struct{})}
	p, err := purge.New(store, purge.Config{Retention: 24 * time.Hour, OnRound: metrics.PurgeRound(store.Table()), Logger: logger})
	require.NoError(t, err)
	done := make(chan error)
	go func() { _, err := p.PurgeOnce(ctx); done <- err }()
	<-logger.logging
	_, err = p.PurgeOnce(ctx)
	require.ErrorIs(t, err, purge.ErrSkipped)
	close(logger.release)
	require.NoError(t, <-done)
	p, err = purge.New(missing, purge.Config{Retention: 24 * time.Hour, OnRound: metrics.PurgeRound(missing.Table())})
	require.NoError(t, err)
	_, err = p.PurgeOnce(ctx)
	require.Error(t, err)
	// SQLite has no partitions: the hook a partitioned table's rounds call
	// (TestPartitionsBlocked runs them on PostgreSQL).
	metrics.PartitionsBlocked(store.Table())([]string{"watermill_inbox_p20270101"})

	families, err := reg.Gather()
	require.NoError(t, err)
	got := scrape{}
	for _, f := range families {
		labels := map[string]map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] == nil {
					labels[l.GetName()] = map[string]bool{}
				}
				labels[l.GetName()][l.GetValue()] = true
			}
		}
		got[f.GetName()] = labels
	}
	return got
}

// blockingLogger blocks its first Info line, a purge round's, until
// released: the round keeps its lock meanwhile.
type blockingLogger struct {
	watermill.NopLogger
	first            atomic.Bool
	logging, release chan struct{}
}

func (l *blockingLogger) Info(string, watermill.LogFields) {
	if l.first.CompareAndSwap(false, true) {
		close(l.logging)
		<-l.release
	}
}

// checkRules checks each rule's selectors, label matchers, grouping labels
// and annotation templates against the scrape. A recording rule's name
// stands for the metrics its expression reads.
func checkRules(t *testing.T, got scrape, rules []rule) {
	t.Helper()
	reads := map[string][]string{} // recording rule -> metric families
	families := func(name string) []string {
		if !strings.Contains(name, ":") {
			require.Contains(t, got, name, "the rules read %s, which prommetrics does not export", name)
			return []string{name}
		}
		fams, ok := reads[name]
		require.True(t, ok, "recording rule %s is used before it is defined", name)
		return fams
	}
	for _, r := range rules {
		name := r.Record + r.Alert
		sels, grouping := parsePromQL(t, r.Expr)
		require.NotEmpty(t, sels, "%s reads no metric", name)
		var fams []string
		for _, sel := range sels {
			selFams := families(sel.name)
			fams = append(fams, selFams...)
			for _, m := range sel.matchers {
				values := []string{m.value}
				if m.op == "=~" || m.op == "!~" {
					values = strings.Split(m.value, "|")
				}
				for _, v := range values {
					require.Regexp(t, `^[a-z_]+$`, v, "%s: %s%s%q: write literal alternatives so that this test can check them", name, m.label, m.op, m.value)
					require.True(t, hasValue(got, selFams, m.label, v), "%s: no %s{%s=%q} in the scrape", name, sel.name, m.label, v)
				}
			}
		}
		for _, l := range grouping {
			require.True(t, hasLabel(got, fams, l), "%s groups by %s, a label of none of %v", name, l, fams)
		}
		for _, a := range r.Annotations {
			for _, m := range regexp.MustCompile(`\$labels\.(\w+)`).FindAllStringSubmatch(a, -1) {
				require.True(t, hasLabel(got, fams, m[1]), "%s: annotation uses $labels.%s, a label of none of %v", name, m[1], fams)
			}
		}
		if r.Record != "" {
			reads[r.Record] = slices.Compact(slices.Sorted(slices.Values(fams)))
		}
	}
}

// checkTestSeries checks the unit tests' input series the same way: their
// names, labels and, but for the user's names, label values.
func checkTestSeries(t *testing.T, got scrape, tests testFile) {
	t.Helper()
	series := regexp.MustCompile(`^(\w+)\{(.*)\}$`)
	pair := regexp.MustCompile(`(\w+)="([^"]*)"`)
	n := 0
	for _, tc := range tests.Tests {
		for _, in := range tc.InputSeries {
			m := series.FindStringSubmatch(in.Series)
			require.NotNil(t, m, "input series %q", in.Series)
			require.Contains(t, got, m[1], "input series %q: prommetrics exports no %s", in.Series, m[1])
			for _, p := range pair.FindAllStringSubmatch(m[2], -1) {
				switch {
				case slices.Contains(targetLabels, p[1]):
				case slices.Contains(freeLabels, p[1]):
					require.True(t, hasLabel(got, m[1:2], p[1]), "input series %q: %s has no label %s", in.Series, m[1], p[1])
				default:
					require.True(t, hasValue(got, m[1:2], p[1], p[2]), "input series %q: no %s{%s=%q} in the scrape", in.Series, m[1], p[1], p[2])
				}
			}
			n++
		}
	}
	require.Positive(t, n)
}

func hasLabel(got scrape, fams []string, label string) bool {
	if slices.Contains(targetLabels, label) {
		return true
	}
	for _, f := range fams {
		if got[f][label] != nil {
			return true
		}
	}
	return false
}

func hasValue(got scrape, fams []string, label, value string) bool {
	for _, f := range fams {
		if got[f][label][value] {
			return true
		}
	}
	return false
}

type selector struct {
	name     string
	matchers []matcher
}

type matcher struct{ label, op, value string }

// promqlToken splits the PromQL the rules use: strings, range brackets,
// numbers and durations, identifiers, operators.
var promqlToken = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|\[[^\]]*\]|[0-9][0-9.]*[a-z]*|[a-zA-Z_:][a-zA-Z0-9_:]*|=~|!~|!=|==|>=|<=|\S`)

var (
	identifier = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	// Words before a parenthesised list of labels.
	groupingWords = []string{"by", "without", "on", "ignoring", "group_left", "group_right"}
	// Words that are not metric names when no parenthesis follows them.
	keywords = []string{"and", "or", "unless", "offset", "bool", "sum", "min", "max", "avg", "count", "group",
		"stddev", "stdvar", "topk", "bottomk", "quantile", "count_values"}
)

// parsePromQL returns the metric selectors of expr, with their label
// matchers, and the labels of its by, without, on and ignoring clauses.
func parsePromQL(t *testing.T, expr string) (sels []selector, grouping []string) {
	t.Helper()
	toks := promqlToken.FindAllString(expr, -1)
	at := func(i int) string {
		if i < len(toks) {
			return toks[i]
		}
		return ""
	}
	for i := 0; i < len(toks); i++ {
		tok, next := toks[i], at(i+1)
		switch {
		case slices.Contains(groupingWords, tok) && next == "(":
			for i += 2; at(i) != ")"; i++ {
				require.Less(t, i, len(toks), "unclosed label list in %s", expr)
				if at(i) != "," {
					grouping = append(grouping, at(i))
				}
			}
		case tok == "{":
			t.Fatalf("selector without a metric name in %s", expr)
		case !identifier.MatchString(tok) || next == "(" || slices.Contains(keywords, tok):
			// a number, an operator, a function or a keyword
		default:
			sel := selector{name: tok}
			if next == "{" {
				for i += 2; at(i) != "}"; {
					require.Less(t, i, len(toks), "unclosed selector in %s", expr)
					label, op, quoted := at(i), at(i+1), at(i+2)
					value, err := strconv.Unquote(quoted)
					require.NoError(t, err, "matcher %s%s%s in %s", label, op, quoted, expr)
					sel.matchers = append(sel.matchers, matcher{label, op, value})
					if i += 3; at(i) == "," {
						i++
					}
				}
			}
			sels = append(sels, sel)
		}
	}
	return sels, grouping
}
