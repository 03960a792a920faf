package main

import (
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The library's constructors name the Go configuration fields in their
// errors (AllowShortRetention, Partitioning): the command checks the flags
// that fill them first, so that its user reads the flags' names instead.
// What they still refuse comes through as it is.

// checkFlags refuses flags that sqlinbox.New would refuse.
func (d *database) checkFlags(db *sql.DB) error {
	if d.partitioning != "none" && d.dialect != "postgresql" {
		return usage("-partitioning %s needs -dialect postgresql: only PostgreSQL tables are partitioned, not %s ones", d.partitioning, d.dialect)
	}
	if d.partitionKey != "processed_at" && d.partitioning == "none" {
		return usage("-partition-key %s needs -partitioning daily or monthly", d.partitionKey)
	}
	// The table name alone: any error is the table's.
	if _, err := sqlinbox.New(db, sqlinbox.Config{Dialect: dialects[d.dialect].dialect, Table: d.table}); err != nil {
		if inner := errors.Unwrap(err); inner != nil {
			err = inner
		}
		return usage("-table: %v", err)
	}
	return nil
}

// checkPurgeFlags refuses flags that purge.New would refuse for store m.
func checkPurgeFlags(c purge.Config, m maintenance.Store, partitioning string) error {
	if c.Retention == 0 {
		return usage("-retention is required: keep rows longer than a copy of an event can still arrive, the broker's retention plus retries (14d, 336h)")
	}
	minimum := c.MinRetention
	if minimum == 0 {
		minimum = purge.DefaultMinRetention
	}
	checkRetention := func(flag string, d time.Duration) error {
		switch {
		case d <= 0:
			return usage("%s must be positive, got %s", flag, days(d))
		case d < minimum && !c.AllowShortRetention:
			return usage("%s %s is below -min-retention %s: rows purged before every copy of their event has arrived let that copy be processed again; keep rows for the broker's retention plus retries, or pass -allow-short-retention",
				flag, days(d), days(minimum))
		}
		return nil
	}
	if err := checkRetention("-retention", c.Retention); err != nil {
		return err
	}
	if len(c.ConsumerRetention) > 0 && m.Partitioned() {
		return usage("-consumer-retention is not available with -partitioning %s: dropping a partition removes every consumer's rows", partitioning)
	}
	for _, consumer := range slices.Sorted(maps.Keys(c.ConsumerRetention)) {
		if err := checkRetention("-consumer-retention "+consumer, c.ConsumerRetention[consumer]); err != nil {
			return err
		}
	}
	// 0 is the dialect's default; an explicit -batch 0 was refused already.
	if c.BatchSize != 0 && c.BatchSize < purge.MinBatchSize {
		return usage("-batch %d is below %d, the smallest batch", c.BatchSize, purge.MinBatchSize)
	}
	if c.BatchSize > purge.MaxBatchSize {
		return usage("-batch %d is above %d, the largest batch: one DELETE that large holds its locks, and the claims waiting behind them, for as long as it runs", c.BatchSize, purge.MaxBatchSize)
	}
	for _, f := range []struct {
		flag     string
		d, limit time.Duration
	}{{"-statement-timeout", c.StatementTimeout, m.Limits().StatementTimeout}, {"-interval", c.Interval, 0}} {
		switch {
		case f.d < 0:
			return usage("%s is negative (%s)", f.flag, f.d)
		case f.limit > 0 && f.d > f.limit:
			return usage("%s %s is above %s, the longest the %s database takes", f.flag, f.d, f.limit, m.Dialect())
		}
	}
	if c.PartitionsAhead < 0 {
		return usage("-partitions-ahead is negative (%d)", c.PartitionsAhead)
	}
	return nil
}

// layoutError refuses a table laid out otherwise than -partitioning and
// -partition-key say, from the findings of its check, before the store
// refuses it naming Config.Partitioning and Config.PartitionKey.
func (d *database) layoutError(table string, findings []maintenance.Finding) error {
	for _, f := range findings {
		if f.Aspect != maintenance.AspectLayout || f.OK {
			continue
		}
		flag := "-partitioning is " + d.partitioning
		if d.partitioning != "none" && strings.HasPrefix(f.Found, "partitioned") {
			flag = "-partition-key is " + d.partitionKey
		}
		return fmt.Errorf("%s is %s but %s\n%s", table, f.Found, flag, remedies[maintenance.AspectLayout])
	}
	return nil
}
