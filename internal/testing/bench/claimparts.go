package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/sqlinbox"
)

// ClaimPart is the WAL one claim writes into a table shaped like part of
// the inbox.
type ClaimPart struct {
	Part   string
	IDType string // the event_id column: text or uuid
	// Bytes is the WAL per claim without full-page images and without the
	// transaction's commit record, which a claim shares with the business
	// write.
	Bytes float64
	// Commit is the commit record's bytes per transaction.
	Commit float64
}

// claimParts are the tables ClaimParts measures, each a part more of the
// inbox than the one before, and the statement that claims in it (%s: the
// table).
var claimParts = []struct {
	part, key, index, claim string
	library                 bool
}{
	{part: "heap only: consumer, event_id, processed_at", claim: claimSQL},
	{part: "+ primary key (consumer, event_id)", key: ", PRIMARY KEY (consumer, event_id)", claim: claimSQL},
	{part: "+ processed_at index", key: ", PRIMARY KEY (consumer, event_id)", index: "processed_at", claim: claimSQL},
	{part: "  the same, plain INSERT without ON CONFLICT", key: ", PRIMARY KEY (consumer, event_id)", index: "processed_at", claim: `INSERT INTO %s (consumer, event_id) VALUES ($1, $2)`},
	{part: "the inbox table as sqlinbox creates it", library: true, claim: claimSQL},
}

// claimSQL is the claim as sqlinbox sends it to PostgreSQL.
const claimSQL = `INSERT INTO %s (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`

// ClaimParts measures, one claim per transaction and n claims per table,
// what each part of the inbox row costs in WAL on PostgreSQL (it needs
// pg_walinspect): the row alone, its primary key, the purge's index on
// processed_at, with event ids stored as text and as uuid. The tables are
// dropped afterwards.
func (a *Admin) ClaimParts(ctx context.Context, n int) ([]ClaimPart, error) {
	wal := a.WAL(ctx)
	if wal == nil || !wal.inspect {
		return nil, fmt.Errorf("the parts of a claim are measured on PostgreSQL with pg_walinspect")
	}
	var out []ClaimPart
	for _, idType := range []string{"text", "uuid"} {
		for _, p := range claimParts {
			table := Name("inbox_bench_part")
			err := a.createPart(ctx, table, idType, p.key, p.index, p.library)
			if err == nil {
				var part ClaimPart
				for range 3 { // a sample lost to ErrWALUnreadable is taken again
					if part, err = a.measurePart(ctx, wal, table, fmt.Sprintf(p.claim, table), n); !errors.Is(err, ErrWALUnreadable) {
						break
					}
				}
				part.Part, part.IDType = p.part, idType
				out = append(out, part)
			}
			if derr := a.Drop(context.WithoutCancel(ctx), table); err == nil {
				err = derr
			}
			if err != nil {
				return nil, fmt.Errorf("%s, %s ids: %w", p.part, idType, err)
			}
		}
	}
	return out, nil
}

func (a *Admin) createPart(ctx context.Context, table, idType, key, index string, library bool) error {
	if library {
		return a.CreateInbox(ctx, sqlinbox.Config{Table: table, UUIDEventIDs: idType == "uuid"})
	}
	_, err := a.db.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE %s (consumer text NOT NULL, event_id %s NOT NULL, processed_at timestamptz NOT NULL DEFAULT now()%s)`, table, idType, key))
	if err == nil && index != "" {
		_, err = a.db.ExecContext(ctx, fmt.Sprintf(`CREATE INDEX ON %s (%s)`, table, index))
	}
	return err
}

// measurePart claims n new random event ids in table, one transaction each.
func (a *Admin) measurePart(ctx context.Context, wal *WAL, table, claim string, n int) (ClaimPart, error) {
	// A few claims first, so that the measured ones find the table's
	// pages and the statement's plan in place.
	for range 20 {
		if _, err := a.db.ExecContext(ctx, claim, Consumer, watermill.NewUUID()); err != nil {
			return ClaimPart{}, err
		}
	}
	from, err := wal.Mark(ctx)
	if err != nil {
		return ClaimPart{}, err
	}
	for range n {
		if _, err := a.db.ExecContext(ctx, claim, Consumer, watermill.NewUUID()); err != nil {
			return ClaimPart{}, err
		}
	}
	to, err := wal.Mark(ctx)
	if err != nil {
		return ClaimPart{}, err
	}
	s, err := wal.between(ctx, from, to, table)
	if err != nil {
		return ClaimPart{}, err
	}
	return ClaimPart{Bytes: float64(s.records-s.commit) / float64(n), Commit: float64(s.commit) / float64(n)}, nil
}
