package testdb

import (
	"time"

	"github.com/watermill-inbox/inbox/internal/clock"
)

// Now is the time of the database servers the tests run against, which
// the library's own calendar reads agree with: the machine's clock, or,
// in the date matrix of test.sh (built with the tag inbox_fakeclock), the
// chosen date its servers run at. A test that dates rows or event ids
// relative to the database's now() takes its time from here, never from
// time.Now.
func Now() time.Time { return clock.Now() }
