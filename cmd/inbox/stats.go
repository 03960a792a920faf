package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// statsJSON is what inbox stats -json prints, for scripts: its field names
// are the command's interface.
type statsJSON struct {
	Table        string          `json:"table"`
	Dialect      string          `json:"dialect"`
	Partitioning string          `json:"partitioning"`
	Now          time.Time       `json:"now"`
	TableBytes   *int64          `json:"table_bytes"` // null when the database does not tell
	IndexBytes   *int64          `json:"index_bytes"`
	Consumers    []consumerJSON  `json:"consumers"`
	Partitions   []partitionJSON `json:"partitions,omitempty"`
}

type consumerJSON struct {
	Consumer string    `json:"consumer"`
	Rows     int64     `json:"rows"`
	Oldest   time.Time `json:"oldest"`
	Newest   time.Time `json:"newest"`
	LastHour int64     `json:"last_hour"`
	LastDay  int64     `json:"last_day"`
	// The event times, on a table partitioned by them.
	OldestEvent *time.Time `json:"oldest_event_time,omitempty"`
	NewestEvent *time.Time `json:"newest_event_time,omitempty"`
}

type partitionJSON struct {
	Name          string     `json:"name"`
	From          *time.Time `json:"from"` // null for the default partition and others the library did not make
	To            *time.Time `json:"to"`
	Default       bool       `json:"default"`
	EstimatedRows *int64     `json:"estimated_rows"` // null before the partition's first ANALYZE
}

// runStats prints what the table holds: a table for people, -json for
// scripts. Counting the claims reads the whole table.
func runStats(ctx context.Context, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	setUsage(fs, stderr,
		"usage: inbox stats -dsn DSN [flags] [-json]",
		"Claims per consumer (a scan of the whole table), table and index sizes, partitions.",
	)
	db := addDatabaseFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if err := parse(fs, args); err != nil {
		return err
	}
	store, sqlDB, err := db.connectTable(ctx)
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	st, err := store.Maintenance().Stats(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(toJSON(store, db, st))
	}
	printStats(stdout, store, db, st)
	return nil
}

func toJSON(store *sqlinbox.Store, db *database, st maintenance.Stats) statsJSON {
	known := func(n int64) *int64 {
		if n < 0 {
			return nil
		}
		return &n
	}
	at := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		return &t
	}
	out := statsJSON{
		Table: store.Table(), Dialect: db.dialect, Partitioning: db.partitioning, Now: st.Now,
		TableBytes: known(st.TableBytes), IndexBytes: known(st.IndexBytes),
		Consumers: []consumerJSON{},
	}
	for _, c := range st.Consumers {
		out.Consumers = append(out.Consumers, consumerJSON{c.Consumer, c.Rows, c.Oldest, c.Newest, c.LastHour, c.LastDay, at(c.OldestEvent), at(c.NewestEvent)})
	}
	for _, p := range st.Partitions {
		out.Partitions = append(out.Partitions, partitionJSON{p.Name, at(p.From), at(p.To), p.Default, known(p.EstimatedRows)})
	}
	return out
}

// timeLayout shows claim times to the second, in UTC.
const timeLayout = "2006-01-02 15:04:05"

func printStats(w io.Writer, store *sqlinbox.Store, db *database, st maintenance.Stats) {
	var rows int64
	for _, c := range st.Consumers {
		rows += c.Rows
	}
	layout := ""
	if db.partitioning != "none" {
		layout = ", partitioned " + db.partitioning
	}
	fmt.Fprintf(w, "%s (%s%s): %d rows, %s of table, %s of indexes; times in UTC, now %s\n\n",
		store.Table(), db.dialect, layout, rows, byteSize(st.TableBytes), byteSize(st.IndexBytes), st.Now.Format(timeLayout))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// A table partitioned by event time also shows the events' times, the
	// partition key: one dated ahead of now is marked.
	events := db.partitionKey == "event_time"
	switch {
	case len(st.Consumers) == 0:
		fmt.Fprintln(tw, "no claims")
	case events:
		fmt.Fprintln(tw, "CONSUMER\tROWS\tOLDEST\tNEWEST\tLAST HOUR\tLAST DAY\tOLDEST EVENT\tNEWEST EVENT")
	default:
		fmt.Fprintln(tw, "CONSUMER\tROWS\tOLDEST\tNEWEST\tLAST HOUR\tLAST DAY")
	}
	ahead := false
	for _, c := range st.Consumers {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d", showValue(c.Consumer), c.Rows, c.Oldest.Format(timeLayout), c.Newest.Format(timeLayout), c.LastHour, c.LastDay)
		if events {
			newest := c.NewestEvent.Format(timeLayout)
			if c.NewestEvent.After(st.Now) {
				newest += " (ahead of now)"
				ahead = true
			}
			fmt.Fprintf(tw, "\t%s\t%s", c.OldestEvent.Format(timeLayout), newest)
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	if ahead {
		fmt.Fprintln(w, "\nsome events are dated ahead of the database clock: once no partition covers their period they block its partition (inbox check says when)")
	}
	if len(st.Partitions) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(tw, "PARTITION\tFROM\tTO\tROWS (ESTIMATE)")
	for _, p := range st.Partitions {
		from, to := "", ""
		switch {
		case p.Default:
			from = "(default)"
		case !p.From.IsZero():
			from, to = p.From.Format(timeLayout), p.To.Format(timeLayout)
		}
		estimate := "unknown (not analyzed yet)"
		if p.EstimatedRows >= 0 {
			estimate = fmt.Sprintf("~%d", p.EstimatedRows)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Name, from, to, estimate)
	}
	_ = tw.Flush()
}

// byteSize renders a size in binary units, "unknown" when negative.
func byteSize(n int64) string {
	if n < 0 {
		return "unknown size"
	}
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
