package maintenance

import "time"

// Claim is one row of an inbox table: a consumer's claim of an event.
type Claim struct {
	EventID     string
	ProcessedAt time.Time // UTC
}

// ClaimFilter selects claims of one consumer: those of EventIDs when it is
// not empty, else those with From <= processed_at < To.
type ClaimFilter struct {
	Consumer string
	EventIDs []string
	From, To time.Time
}
