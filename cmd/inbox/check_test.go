package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
)

// A table that inbox schema made passes every check; so does a read-only
// user, since checking only reads.
func TestCheckPasses(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := setup(t, tg)
		code, out, errOut := f.run(t, "check")
		require.Equal(t, exitOK, code, out+errOut)
		require.Contains(t, out, "ok    connection: the "+tg.dialect+" database answers\n")
		require.Contains(t, out, "ok    table: "+f.table+" exists\n")
		for _, line := range []string{"ok    layout: not partitioned\n", "ok    columns: consumer ", "ok    fingerprint column: none\n",
			"ok    primary key: consumer, event_id\n", "ok    processed_at index: present\n", "-     retention: not checked"} {
			require.Contains(t, out, line)
		}
		require.NotContains(t, out, "FAIL")
		require.NotContains(t, out, "warn ", "the schema's own default holds UTC")
		require.True(t, strings.HasSuffix(out, "\nevery check passed, but the purge retention was not checked: give -retention and -broker-retention to check it\n"), out)

		code, out, errOut = runCmd("check", "-dialect", tg.dialect, "-dsn", tg.readOnly(t, f.db, f.table), "-table", f.table)
		require.Equal(t, exitOK, code, out+errOut)
	})
}

// A MariaDB table whose processed_at defaults to the writer's session
// time may hold claims of earlier releases in local time: inbox check
// passes it, warns, and prints the migration.
func TestCheckWarnsLocalTimeDefault(t *testing.T) {
	t.Parallel()
	f := setup(t, mariadb)
	_, err := f.db.Exec(fmt.Sprintf("ALTER TABLE %s MODIFY processed_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)", f.table))
	require.NoError(t, err)
	code, out, errOut := f.run(t, "check")
	require.Equal(t, exitOK, code, out+errOut)
	require.Contains(t, out, "warn  processed_at default: current_timestamp(6)\n      processed_at defaults to current_timestamp(6), the writer's session time")
	require.Contains(t, out, "the purge keeps every row 14 h past its retention")
	require.Contains(t, out, fmt.Sprintf("ALTER TABLE `%s` MODIFY processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))\n", f.table))
	require.NotContains(t, out, "FAIL")
}

// The purge retention must outlive the broker's plus the slack, for every
// consumer's retention.
func TestCheckRetention(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := setup(t, tg)
		code, out, errOut := f.run(t, "check", "-retention", "8d", "-broker-retention", "7d")
		require.Equal(t, exitOK, code, out+errOut)
		require.Contains(t, out, "ok    retention: -retention 8d outlives the broker's 7d plus 1d of slack\n")
		require.True(t, strings.HasSuffix(out, "\nevery check passed\n"), out)

		code, out, errOut = f.run(t, "check", "-retention", "7d", "-broker-retention", "7d")
		require.Equal(t, exitFailed, code)
		require.Contains(t, out, "FAIL  retention: -retention 7d is shorter than the broker's 7d plus 1d of slack: an event replayed from the broker could find its claim purged and be processed again\n      keep claims at least 8d")
		require.Contains(t, errOut, "inbox check: 1 check failed")

		code, out, _ = f.run(t, "check", "-retention", "14d", "-consumer-retention", "audit=90d", "-consumer-retention", "billing=7d", "-broker-retention", "7d", "-slack", "36h")
		require.Equal(t, exitFailed, code)
		require.Contains(t, out, "ok    retention: -retention 14d outlives the broker's 7d plus 36h0m0s of slack")
		require.Contains(t, out, "ok    retention: -consumer-retention audit 90d")
		require.Contains(t, out, "FAIL  retention: -consumer-retention billing 7d is shorter")

		for _, args := range [][]string{{"-retention", "7d"}, {"-broker-retention", "7d"}, {"-consumer-retention", "a=1d"}} {
			code, _, errOut = f.run(t, "check", args...)
			require.Equal(t, exitUsage, code, "%v", args)
			require.Contains(t, errOut, "-broker-retention", "%v", args)
		}
	})
}

// What the table lacks or has otherwise than configured fails its check,
// with what to do.
func TestCheckMismatches(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := setup(t, tg)
		code, out, _ := f.run(t, "check", "-fingerprints")
		require.Equal(t, exitFailed, code)
		require.Regexp(t, `FAIL  fingerprint column: none, want fingerprint \S+\n      add the column: inbox schema -add-fingerprint-column -apply`, out)

		code, out, _ = f.run(t, "check", "-uuid-event-ids")
		if tg.dialect == "sqlite" {
			require.Equal(t, exitOK, code, "SQLite keeps UUIDs as text: "+out)
		} else {
			require.Equal(t, exitFailed, code)
			require.Regexp(t, `FAIL  columns: consumer \S+, event_id \S+, processed_at .*, want .*event_id (uuid|binary\(16\))`, out)
		}

		_, err := f.db.Exec(fmt.Sprintf("DROP INDEX %s_processed_at_idx", f.table) + map[string]string{"mysql": " ON " + f.table}[tg.dialect])
		require.NoError(t, err)
		code, out, _ = f.run(t, "check")
		require.Equal(t, exitFailed, code)
		require.Contains(t, out, "FAIL  processed_at index: none; the indexes lead with consumer, want an index whose first column is processed_at\n      the purge")

		code, out, _ = f.run(t, "check", "-table", "missing_table")
		require.Equal(t, exitFailed, code)
		require.Contains(t, out, "FAIL  table: missing_table does not exist\n      create it with inbox schema -apply")

		code, _, errOut := runCmd("check", "-dialect", tg.dialect, "-dsn", unreachable(tg))
		require.Equal(t, exitConnect, code)
		require.Contains(t, errOut, "cannot ")
	})
}

// On PostgreSQL the layout must match -partitioning, and a partitioned
// table needs its partitions ahead, which a purge or inbox schema -apply
// create.
func TestCheckPartitions(t *testing.T) {
	t.Parallel()
	plain := setup(t, postgres)
	code, out, _ := plain.run(t, "check", "-partitioning", "daily")
	require.Equal(t, exitFailed, code)
	require.Contains(t, out, "FAIL  layout: not partitioned, want partitioned by processed_at (daily)\n      -partitioning and -partition-key must describe the table as created")

	f := setup(t, postgres, "-partitioning", "daily")
	testdb.DropTimePartitions(t, f.db, f.table) // a table from before CreateSchema made them
	code, out, _ = f.run(t, "check")
	require.Equal(t, exitFailed, code)
	require.Contains(t, out, "FAIL  layout: partitioned by processed_at, want not partitioned")
	require.Contains(t, out, "ok    primary key: consumer, event_id, processed_at\n", "the key of the table's own layout")

	code, out, _ = f.run(t, "check", "-partitioning", "daily")
	require.Equal(t, exitFailed, code)
	require.Contains(t, out, "ok    primary key: consumer, event_id, processed_at\n")
	require.Regexp(t, `FAIL  partitions: 0 time partitions; none for the current period \(its rows go to the default partition\); the default partition, want the 3 daily partitions ahead of the current one, and the default partition; missing \S+_p\d{8}, \S+, \S+\n      run inbox purge`, out)

	code, _, errOut := f.run(t, "purge", "-partitioning", "daily", "-retention", "2d")
	require.Equal(t, exitOK, code, errOut)
	code, out, errOut = f.run(t, "check", "-partitioning", "daily")
	require.Equal(t, exitOK, code, out+errOut)
	require.Regexp(t, `ok    partitions: 4 time partitions, \d{4}-\d\d-\d\d to \d{4}-\d\d-\d\d; the default partition\n`, out)
	code, out, _ = f.run(t, "check", "-partitioning", "daily", "-partitions-ahead", "5")
	require.Equal(t, exitFailed, code)
	require.Contains(t, out, "missing")
}

// A table partitioned by the time inside event ids checks out with the
// flags it was made with, and is told apart from one partitioned by
// processed_at.
func TestCheckEventTimePartitions(t *testing.T) {
	t.Parallel()
	flags := []string{"-partitioning", "daily", "-partition-key", "event_time"}
	f := setup(t, postgres, flags...)
	code, out, errOut := f.run(t, "check", flags...)
	require.Equal(t, exitOK, code, out+errOut)
	require.Contains(t, out, "ok    layout: partitioned by event_time\n")
	require.Contains(t, out, "ok    primary key: consumer, event_time, event_id\n")
	code, out, _ = f.run(t, "check", "-partitioning", "daily")
	require.Equal(t, exitFailed, code)
	require.Contains(t, out, "FAIL  layout: partitioned by event_time, want partitioned by processed_at (daily)")
	code, out, errOut = f.run(t, "purge", append(flags, "-retention", "2d")...)
	require.Equal(t, exitOK, code, out+errOut)
	code, _, _ = f.run(t, "check", "-partition-key", "event_time")
	require.Equal(t, exitUsage, code, "event_time needs partitions")
}

// One event dated ahead of the clock on a table partitioned by event time:
// once its period comes within the partitions ahead, the default partition
// holding its row keeps the purge from creating the period's partition.
// The purge says so at error level, stats shows the event time ahead of
// now, check fails, names the row and advises inbox schema -apply, which
// moves the row into the partition it creates: check turns green, and the
// event is still a duplicate.
func TestCheckPeriodBlockedByEventDatedAhead(t *testing.T) {
	t.Parallel()
	flags := []string{"-partitioning", "daily", "-partition-key", "event_time"}
	f := setup(t, postgres, flags...)
	partition, ahead := testdb.BlockLastTimePartition(t, f.db, f.table)
	id := testdb.UUIDv7(ahead, "dated ahead")
	require.True(t, f.claim(t, "billing", id))

	code, out, errOut := f.run(t, "purge", append(flags, "-retention", "14d")...)
	require.Equal(t, exitOK, code, out+errOut)
	require.Regexp(t, `level=ERROR\s+msg="Inbox partition not created: the default partition holds rows of its period`, errOut)
	require.Contains(t, errOut, "partition="+partition)

	code, out, errOut = f.run(t, "stats", flags...)
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `LAST DAY +OLDEST EVENT +NEWEST EVENT\n`, out)
	require.Contains(t, out, ahead.UTC().Format(timeLayout)+" (ahead of now)")
	code, out, errOut = f.run(t, "stats", append(flags, "-json")...)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, `"newest_event_time": "`+ahead.UTC().Format(time.RFC3339))

	code, out, _ = f.run(t, "check", flags...)
	require.Equal(t, exitFailed, code, out)
	require.Contains(t, out, "FAIL  partitions: ")
	require.Contains(t, out, "      "+partition+" cannot be created: the default partition holds 1 row of its period ("+
		ahead.UTC().Format(timeLayout)+" UTC, dated ahead of the clock: events with a time in the future)\n      "+blockedRemedy+"\n")

	code, out, errOut = f.run(t, "schema", append(flags, "-apply")...)
	require.Equal(t, exitOK, code, out+errOut)
	require.Equal(t, "created partition "+partition+", moving its period's 1 row out of the default partition\n", out)
	code, out, errOut = f.run(t, "check", flags...)
	require.Equal(t, exitOK, code, out+errOut)
	require.NotContains(t, out, "cannot be created")
	require.False(t, f.claim(t, "billing", id), "the moved claim still makes its event a duplicate")
	var n int
	require.NoError(t, f.db.QueryRow(`SELECT count(*) FROM `+partition).Scan(&n))
	require.Equal(t, 1, n, "the row is in its partition")
}

// Two services claiming with one consumer now, each for longer than a
// renewal, fail the check, naming both. Two that each claimed briefly (a
// finished test run beside the service) are a warning while their leases
// live, not a failure; a process's warnings are listed without failing it.
func TestCheckSharedConsumer(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := setup(t, tg)
		code, out, errOut := f.run(t, "check")
		require.Equal(t, exitOK, code, out+errOut)
		require.Contains(t, out, "-     consumers: no process claimed in the last 1m0s\n")

		for _, service := range []string{"example.com/billing", "example.com/mailer"} {
			mw, err := inbox.NewMiddleware(inbox.Config{Store: f.store, Consumer: "handle_orders", Service: service})
			require.NoError(t, err)
			msg := message.NewMessage(watermill.NewUUID(), nil)
			_, err = mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg) // takes no transaction: a warning
			require.NoError(t, err)
		}
		// Each warning reaches the lease table with a renewal beside the
		// message, which may still be on its way.
		require.Eventually(t, func() bool {
			code, out, errOut = f.run(t, "check")
			return strings.Contains(out, `tx_unused (service example.com/mailer, process `) && strings.Contains(out, `tx_unused (service example.com/billing, process `)
		}, time.Minute, 50*time.Millisecond)
		require.Equal(t, exitOK, code, out+errOut)
		require.Contains(t, out, `WARN  consumer "handle_orders": services example.com/billing and example.com/mailer claimed for it within 1m0s, not both for long or not now`)

		// Both have claimed for a minute, and renewed now.
		_, err := f.db.Exec(fmt.Sprintf(map[string]string{
			"postgresql": `UPDATE %s SET since = since - interval '1 minute'`,
			"mysql":      `UPDATE %s SET since = since - INTERVAL 1 MINUTE`,
			"sqlite":     `UPDATE %s SET since = strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', since, '-1 minute')`,
		}[tg.dialect], f.store.LeaseTable()))
		require.NoError(t, err)
		code, out, errOut = f.run(t, "check")
		require.Equal(t, exitFailed, code, out+errOut)
		require.Contains(t, out, `FAIL  consumer "handle_orders": services example.com/billing and example.com/mailer claim for it now`)
		require.Contains(t, out, `WARN  consumer "handle_orders": tx_unused (service example.com/billing, process `)
	})
}

// A table from a release before the lease table, or whose lease table the
// role could not create: the middleware runs without the shared consumer
// check, and the check fails, naming the table and the statement that
// creates it.
func TestCheckNoLeaseTable(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := setup(t, tg)
		_, err := f.db.Exec("DROP TABLE " + f.store.LeaseTable())
		require.NoError(t, err)
		code, out, errOut := f.run(t, "check")
		require.Equal(t, exitFailed, code, out+errOut)
		require.Contains(t, out, "FAIL  consumers: the lease table does not exist: "+f.store.LeaseTable()+", so the shared consumer check is off")
		require.Contains(t, out, "CREATE TABLE IF NOT EXISTS ")
	})
}
