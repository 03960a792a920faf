package maintenance

import "time"

// Stats is what an inbox table holds, read by [Store.Stats].
type Stats struct {
	// Now is the database clock when the statistics were read; LastHour
	// and LastDay count back from it.
	Now time.Time
	// Consumers has one entry per consumer with claims, sorted by name
	// (byte order).
	Consumers []ConsumerStats
	// TableBytes and IndexBytes are the table's size on disk, every
	// partition included, and its indexes' size; -1 when the database does
	// not tell. MySQL's are InnoDB's estimates, whose table bytes include
	// the primary key (the table is stored in it).
	TableBytes, IndexBytes int64
	// Partitions lists the partitions of a partitioned table, the time
	// partitions oldest first, then any other (the default partition last).
	Partitions []PartitionStats
}

// ConsumerStats counts one consumer's claims.
type ConsumerStats struct {
	Consumer          string
	Rows              int64
	Oldest, Newest    time.Time // processed_at of the oldest and newest claim, UTC
	LastHour, LastDay int64     // claims made in the last hour and day
	// OldestEvent and NewestEvent are the earliest and latest event_time
	// of the consumer's claims on a table partitioned by event time
	// (UTC), zero on other tables. An event dated ahead of [Stats.Now]
	// lands in the default partition when no partition covers its period
	// yet.
	OldestEvent, NewestEvent time.Time
}

// PartitionStats is one partition of a partitioned table. From and To are
// zero for a partition this library did not make (the default partition
// among them).
type PartitionStats struct {
	Partition
	Default bool
	// EstimatedRows is the database's estimate of the partition's rows as
	// of its last ANALYZE (autovacuum runs one); -1 before the first.
	EstimatedRows int64
}
