package inbox_test

import (
	"context"
	"database/sql"
	"errors"

	inbox "github.com/watermill-inbox/inbox"
)

// nopStore satisfies inbox.Store for configuration tests that never claim.
type nopStore struct{}

func (nopStore) Claim(context.Context, *sql.TxOptions, string, string, []byte) (inbox.StoreTx, []byte, error) {
	return nil, nil, errors.New("nopStore does not claim")
}
