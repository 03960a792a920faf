package maintenance

import "time"

// Aspects of an inbox table that [Store.Check] compares with the store's
// configuration, one [Finding] each.
const (
	AspectLayout      = "layout"             // partitioned or not
	AspectColumns     = "columns"            // consumer, event_id, processed_at and their types
	AspectFingerprint = "fingerprint column" // present when the configuration uses fingerprints
	AspectPrimaryKey  = "primary key"
	AspectIndex       = "processed_at index"   // the purge's and OldestClaim's
	AspectPartitions  = "partitions"           // the current period and those ahead, and the default partition
	AspectTimeDefault = "processed_at default" // found only when it writes local times
)

// TableCheck is what [Store.Check] found.
type TableCheck struct {
	// Exists is false when the table does not exist; Findings is then
	// empty.
	Exists   bool
	Findings []Finding
}

// Finding compares one aspect of the table with the configuration.
type Finding struct {
	Aspect string
	OK     bool
	// Found is what the table has; Want, when not OK, what the
	// configuration needs.
	Found, Want string
	// Warning, on a finding that is OK, is a suspicion: what may be
	// wrong, what the library does about it, and what to do.
	Warning string
	// Blocked lists, for [AspectPartitions], the periods (the current one
	// and those ahead) whose partition is missing and cannot be created,
	// because the default partition holds rows of them.
	Blocked []BlockedPeriod
}

// BlockedPeriod is a period whose partition cannot be created while the
// default partition holds rows of it: on a table partitioned by event
// time, events dated ahead of the clock; on one partitioned by
// processed_at, claims made while no partition covered the period.
// [PurgeSession.MoveBlocked] creates the partition with them.
type BlockedPeriod struct {
	Partition
	// Rows is how many rows of the period the default partition holds;
	// First and Last are the earliest and latest of their partition key
	// (event_time or processed_at), UTC.
	Rows        int64
	First, Last time.Time
}

// OK reports whether every finding is.
func (c TableCheck) OK() bool {
	for _, f := range c.Findings {
		if !f.OK {
			return false
		}
	}
	return c.Exists
}
