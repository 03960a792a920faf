package inbox_test

import (
	"context"
	"errors"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// nopStore satisfies inboxdriver.Store for configuration tests that never claim.
type nopStore struct{}

func (nopStore) Claim(context.Context, inboxdriver.Claim) (inboxdriver.Tx, []byte, error) {
	return nil, nil, errors.New("nopStore does not claim")
}
