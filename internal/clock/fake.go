//go:build inbox_fakeclock

package clock

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// OffsetEnv names the variable of the offset: whole seconds, negative for
// a clock behind this machine's.
const OffsetEnv = "INBOX_TEST_CLOCK_OFFSET"

var offset = func() time.Duration {
	v := os.Getenv(OffsetEnv)
	if v == "" {
		return 0
	}
	s, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		panic(fmt.Sprintf("%s=%q: want whole seconds", OffsetEnv, v))
	}
	return time.Duration(s) * time.Second
}()

// Now is time.Now shifted by the offset.
func Now() time.Time { return time.Now().Add(offset) }
