package galera_test

import "testing"

func testCost(t *testing.T, cluster any) {}
