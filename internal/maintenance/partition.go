package maintenance

import "time"

// Partition is one time partition of a partitioned inbox table: the rows
// with From <= processed_at < To (UTC).
type Partition struct {
	Name     string
	From, To time.Time
}

func (p Partition) String() string { return p.Name }
