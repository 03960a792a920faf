package maintenance

// Aspects of an inbox table that Store.Check compares with the store's
// configuration, one Finding each.
const (
	AspectLayout      = "layout"             // partitioned or not
	AspectColumns     = "columns"            // consumer, event_id, processed_at and their types
	AspectFingerprint = "fingerprint column" // present when the configuration uses fingerprints
	AspectPrimaryKey  = "primary key"
	AspectIndex       = "processed_at index" // the purge's and OldestClaim's
	AspectPartitions  = "partitions"         // the current period and those ahead, and the default partition
)

// TableCheck is what Store.Check found.
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
