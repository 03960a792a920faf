package prommetrics

import _ "embed" // Rules

// Rules is a Prometheus rule file for these metrics: recording rules, and
// alerts on failing claims, rollbacks, racing copies, a purge that stopped
// or fails, a table that cannot be read, stale events, reused ids and
// messages without an id, each with a
// runbook in the repository's docs/operations.md. Write it to a file listed
// under rule_files, or put its groups in the spec of a kube-prometheus
// PrometheusRule.
//
// Edit it first: WatermillInboxPurgeStopped assumes a 14-day retention (set
// it to your [purge.Config.Retention] plus slack), and the metric names assume
// [DefaultNamespace]: when [New] was given another namespace, replace every
// "watermill_inbox" in it with that namespace ([strings.ReplaceAll]), which
// renames the recording rules too.
//
// [purge.Config.Retention]: https://pkg.go.dev/github.com/watermill-inbox/inbox/purge#Config.Retention
//
//go:embed rules/rules.yml
var Rules string
