package testdb

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
)

// UUIDv7 returns the UUIDv7 of label made at at: the same for the same
// label and millisecond, so a test can name its events and still give them
// ids that carry a chosen time.
func UUIDv7(at time.Time, label string) string {
	sum := sha256.Sum256([]byte(label))
	h := hex.EncodeToString(sum[:])
	ms := fmt.Sprintf("%012x", uint64(at.UnixMilli())&(1<<48-1))
	return ms[:8] + "-" + ms[8:] + "-7" + h[0:3] + "-8" + h[3:6] + "-" + h[6:18]
}
