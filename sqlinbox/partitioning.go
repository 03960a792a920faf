package sqlinbox

import (
	"fmt"
	"strconv"
)

// Partitioning splits a PostgreSQL inbox table into time ranges, of
// processed_at or of the time inside event ids ([Config.PartitionKey]), so
// that the purge drops whole partitions (instant, no dead rows, no WAL per
// row) instead of deleting rows one by one.
type Partitioning int

const (
	// NoPartitioning is one plain table, purged by batched deletes.
	NoPartitioning Partitioning = iota
	// Daily partitions: one table per UTC day.
	Daily
	// Monthly partitions: one table per UTC month.
	Monthly
)

func (p Partitioning) String() string {
	switch p {
	case NoPartitioning:
		return "none"
	case Daily:
		return "daily"
	case Monthly:
		return "monthly"
	}
	return "Partitioning(" + strconv.Itoa(int(p)) + ")"
}

// PartitionKey is the time a partitioned table is split by.
type PartitionKey int

const (
	// ProcessedAt partitions by when the claim was made. Any event id
	// works, but a duplicate may arrive after its original's partition
	// closed: each claim takes an advisory lock on the event and probes
	// every partition's key index, costlier the more partitions there are.
	ProcessedAt PartitionKey = iota
	// EventIDTime partitions by the time inside the event id (UUIDv7 or
	// ULID, see [inbox.TimeInEventID]), stored in an event_time column. Every
	// copy of an event carries the same id, so every copy falls in the same
	// partition, and the key (consumer, event_time, event_id) decides a
	// duplicate as on a plain table: one index probe, no advisory lock, and
	// on a pgxinbox.Store no round trip beyond the business write's. Ids
	// without a time are refused with [inbox.ErrInvalidEventID].
	//
	// An event whose time no partition covers (older than the oldest
	// partition left by the purge, or further ahead than the partitions
	// made) lands in the default partition, still deduplicated there, and
	// is purged by its event time. An event older than the retention can
	// no longer be recognised as a duplicate once its partition was
	// dropped: set [inbox.Config.MaxEventAge] below the retention, with
	// [inbox.EventTimeFromEventID].
	//
	// [inbox.Config.MaxEventAge]: https://pkg.go.dev/github.com/watermill-inbox/inbox#Config.MaxEventAge
	// [inbox.ErrInvalidEventID]: https://pkg.go.dev/github.com/watermill-inbox/inbox#ErrInvalidEventID
	// [inbox.EventTimeFromEventID]: https://pkg.go.dev/github.com/watermill-inbox/inbox#EventTimeFromEventID
	// [inbox.TimeInEventID]: https://pkg.go.dev/github.com/watermill-inbox/inbox#TimeInEventID
	EventIDTime
)

func (k PartitionKey) String() string {
	switch k {
	case ProcessedAt:
		return "processed_at"
	case EventIDTime:
		return "event_time"
	}
	return "PartitionKey(" + strconv.Itoa(int(k)) + ")"
}

// column is the table column the partitions range over.
func (k PartitionKey) column() string { return k.String() }

// checkPartitioning validates [Config.Partitioning] for a dialect.
func checkPartitioning(c Config) error {
	switch c.Partitioning {
	case NoPartitioning:
		if c.PartitionKey != ProcessedAt {
			return fmt.Errorf("PartitionKey: %s needs Partitioning Daily or Monthly", c.PartitionKey)
		}
		return nil
	case Daily, Monthly:
		if c.Dialect != PostgreSQL {
			return fmt.Errorf("Partitioning: %s is only available on PostgreSQL, not %s", c.Partitioning, c.Dialect)
		}
		if c.PartitionKey != ProcessedAt && c.PartitionKey != EventIDTime {
			return fmt.Errorf("PartitionKey: unknown value %d (use sqlinbox.ProcessedAt or EventIDTime)", int(c.PartitionKey))
		}
		return nil
	}
	return fmt.Errorf("Partitioning: unknown value %d (use sqlinbox.NoPartitioning, Daily or Monthly)", int(c.Partitioning))
}
