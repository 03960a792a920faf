//go:build !inbox_fakeclock

// Package clock is the library's wall clock where it compares with a
// calendar: an event's time against MaxEventAge, a period against the
// database's dates. It is time.Now. Built with the tag inbox_fakeclock it
// runs ahead by the seconds in INBOX_TEST_CLOCK_OFFSET, as the database
// servers of the test suite's date matrix do under libfaketime, so that
// the library and its database agree on a chosen date (a month's last day,
// 31 December, a DST change, 29 February).
package clock

import "time"

// Now is time.Now.
func Now() time.Time { return time.Now() }
