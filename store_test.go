package inbox_test

import (
	"context"
	"database/sql"
	"errors"
)

// nopStore satisfies inbox.Store for configuration tests that never claim.
type nopStore struct{}

func (nopStore) Claim(context.Context, *sql.TxOptions, string, string) (*sql.Tx, bool, error) {
	return nil, false, errors.New("nopStore does not claim")
}
