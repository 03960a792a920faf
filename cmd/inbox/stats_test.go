package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
)

// statsFixture has billing's claims: 40 three days old, 1 five hours old,
// 2 half an hour old; and mailer's 5 three days old.
func statsFixture(t *testing.T, tg target, flags ...string) *fixture {
	t.Helper()
	f := setup(t, tg, flags...)
	f.seed(t, "billing", 3*day, ids("old-", 40)...)
	f.seed(t, "billing", 5*time.Hour, "day-1")
	f.seed(t, "billing", 30*time.Minute, "hour-1", "hour-2")
	f.seed(t, "mailer", 3*day, ids("old-", 5)...)
	return f
}

func TestStats(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := statsFixture(t, tg)
		code, out, errOut := f.run(t, "stats", "-json")
		require.Equal(t, exitOK, code, errOut)
		var st statsJSON
		require.NoError(t, json.Unmarshal([]byte(out), &st), out)
		require.Equal(t, f.table, st.Table)
		require.Equal(t, tg.dialect, st.Dialect)
		require.WithinDuration(t, testdb.Now(), st.Now, time.Minute)
		require.Len(t, st.Consumers, 2)
		billing, mailer := st.Consumers[0], st.Consumers[1]
		require.Equal(t, "billing", billing.Consumer)
		require.EqualValues(t, 43, billing.Rows)
		require.EqualValues(t, 2, billing.LastHour)
		require.EqualValues(t, 3, billing.LastDay)
		require.WithinDuration(t, st.Now.Add(-3*day), billing.Oldest, time.Minute)
		require.WithinDuration(t, st.Now.Add(-30*time.Minute), billing.Newest, time.Minute)
		require.Equal(t, consumerJSON{Consumer: "mailer", Rows: 5, Oldest: mailer.Oldest, Newest: mailer.Newest}, mailer)
		require.NotNil(t, st.TableBytes)
		require.Positive(t, *st.TableBytes)
		require.NotNil(t, st.IndexBytes)
		require.Empty(t, st.Partitions)

		code, out, errOut = f.run(t, "stats")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, fmt.Sprintf("%s (%s): 48 rows, ", f.table, tg.dialect))
		require.Regexp(t, `CONSUMER +ROWS +OLDEST +NEWEST +LAST HOUR +LAST DAY\n`, out)
		require.Regexp(t, `\nbilling +43 +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d +2 +3\n`, out)
		require.Regexp(t, `\nmailer +5 +.* +0 +0\n`, out)
	})
}

// On a partitioned table every partition shows with its range and the
// estimate of its rows.
func TestStatsPartitions(t *testing.T) {
	t.Parallel()
	f := setup(t, postgres, "-partitioning", "daily")
	testdb.DropTimePartitions(t, f.db, f.table) // a table from before CreateSchema made them
	code, out, errOut := f.run(t, "schema", "-partitioning", "daily", "-apply", "-partitions-ahead", "1")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "created partition "+f.table+"_p")
	f.seed(t, "billing", 3*day, ids("old-", 40)...) // no partition: the default
	f.seed(t, "mailer", 3*day, ids("old-", 8)...)
	f.seed(t, "billing", 0, "now-1") // today's partition
	_, err := f.db.Exec("ANALYZE " + f.table)
	require.NoError(t, err)

	code, out, errOut = f.run(t, "stats", "-partitioning", "daily", "-json")
	require.Equal(t, exitOK, code, errOut)
	var st statsJSON
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.Equal(t, "daily", st.Partitioning)
	require.Len(t, st.Partitions, 3, "today's, tomorrow's, the default")
	// The day of the row claimed now: today's, unless a day began since
	// the partitions were made.
	var at time.Time
	require.NoError(t, f.db.QueryRow(`SELECT processed_at FROM `+f.table+` WHERE event_id = 'now-1'`).Scan(&at))
	day0 := at.UTC().Truncate(day)
	i := slices.IndexFunc(st.Partitions, func(p partitionJSON) bool { return p.From != nil && p.From.Equal(day0) })
	require.GreaterOrEqual(t, i, 0, "%+v", st.Partitions)
	require.Equal(t, partitionJSON{Name: f.table + "_p" + day0.Format("20060102"), From: &day0, To: ptr(day0.Add(day)), EstimatedRows: ptr[int64](1)}, st.Partitions[i])
	require.Equal(t, partitionJSON{Name: f.table + "_default", Default: true, EstimatedRows: ptr[int64](48)}, st.Partitions[2])
	require.EqualValues(t, 41, st.Consumers[0].Rows)
	require.EqualValues(t, 8, st.Consumers[1].Rows)

	code, out, errOut = f.run(t, "stats", "-partitioning", "daily")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `PARTITION +FROM +TO +ROWS \(ESTIMATE\)\n`, out)
	require.Regexp(t, fmt.Sprintf(`\n%s_p%s +%s 00:00:00 +%s 00:00:00 +~1\n`, f.table, day0.Format("20060102"), day0.Format(time.DateOnly), day0.Add(day).Format(time.DateOnly)), out)
	require.Regexp(t, fmt.Sprintf(`\n%s_default +\(default\) +~48\n`, f.table), out)
}

// A table laid out otherwise than the flags say is refused in the flags'
// names: a command-line user has no Config to set.
func TestStatsLayoutNamesTheFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		made, given []string
		want        string
	}{
		{[]string{"-partitioning", "daily"}, nil, "is partitioned by processed_at but -partitioning is none"},
		{nil, []string{"-partitioning", "daily"}, "is not partitioned but -partitioning is daily"},
		{[]string{"-partitioning", "daily", "-partition-key", "event_time"}, []string{"-partitioning", "daily"}, "is partitioned by event_time but -partition-key is processed_at"},
	} {
		f := setup(t, postgres, tc.made...)
		for sub, more := range map[string][]string{
			"stats":  nil,
			"forget": {"-consumer", "billing", "-from", "2000-01-01"},
			"purge":  {"-retention", "30d"},
		} {
			args := append(append([]string{}, tc.given...), more...)
			code, out, errOut := f.run(t, sub, args...)
			require.Equal(t, exitFailed, code, "%s %v: %s", sub, tc.given, out)
			require.Contains(t, errOut, f.table+" "+tc.want, "%s %v", sub, tc.given)
			require.Contains(t, errOut, "-partitioning and -partition-key must describe the table as created")
			require.NotContains(t, errOut, "Config.", "%s %v", sub, tc.given)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// Stats of an empty table, a missing one, through a read-only user, and
// without a database.
func TestStatsCases(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := setup(t, tg)
		code, out, errOut := f.run(t, "stats")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "no claims")

		f.seed(t, "billing", time.Hour, "e1")
		code, out, errOut = runCmd("stats", "-dialect", tg.dialect, "-dsn", tg.readOnly(t, f.db, f.table), "-table", f.table)
		require.Equal(t, exitOK, code, errOut)
		require.Regexp(t, `\nbilling +1 `, out)

		code, _, errOut = f.run(t, "stats", "-table", "missing_table")
		require.Equal(t, exitFailed, code)
		require.Contains(t, errOut, "missing_table does not exist in this database: create it with inbox schema -apply")

		code, _, errOut = runCmd("stats", "-dialect", tg.dialect, "-dsn", unreachable(tg))
		require.Equal(t, exitConnect, code, errOut)
		require.Contains(t, errOut, "cannot ")
	})
}
