package sqlinbox

import "strings"

// IsUnavailable implements [inboxdriver.UnavailableDetector]: err is the
// database or the connection to it going away, by its SQLSTATE or error
// number, so that the middleware reports a handler statement failing that
// way as transient (nothing committed; retry) rather than as the handler's
// own failure.
func (s *Store) IsUnavailable(err error) bool {
	if code := pgCode(err); code != "" {
		switch code {
		case "57P01", // admin_shutdown
			"57P02", // crash_shutdown
			"57P03", // cannot_connect_now: starting up, or in recovery
			"53300": // too_many_connections
			return true
		}
		return strings.HasPrefix(code, "08") // connection_exception
	}
	if number, ok := mysqlErrorNumber(err); ok {
		switch number {
		case 1040, // too many connections
			1053,       // server shutdown in progress
			1927,       // connection was killed
			2002, 2003, // cannot connect
			2006, // server has gone away
			2013: // lost connection during query
			return true
		}
	}
	return false
}
