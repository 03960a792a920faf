package inbox_test

import (
	"context"
	"database/sql"
	"errors"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// nopStore satisfies inboxdriver.Store for configuration tests that never claim.
type nopStore struct{}

func (nopStore) Claim(context.Context, *sql.TxOptions, string, string, []byte) (inboxdriver.Tx, []byte, error) {
	return nil, nil, errors.New("nopStore does not claim")
}
