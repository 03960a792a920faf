// Package errtext renders values inside error messages, the same way in
// every package of the module.
package errtext

import "fmt"

// maxQuoted is how many bytes of a value [Quote] shows: enough to recognise
// an event id or a consumer, short enough for one log line whatever the
// producer sent.
const maxQuoted = 64

// Quote returns s as a Go string literal, so that invisible and invalid
// bytes show, cut after 64 bytes with "..." after the closing quote: the
// dots are not part of the value.
func Quote(s string) string {
	if len(s) > maxQuoted {
		return fmt.Sprintf("%q...", s[:maxQuoted])
	}
	return fmt.Sprintf("%q", s)
}
