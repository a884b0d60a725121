package localjail

import "testing"

// The descriptor budget: 256 connections of 2 descriptors per intern
// beside a reserve of 4096.
func TestDescriptorBudget(t *testing.T) {
	for _, c := range []struct {
		nofile   uint64
		maxAwake int
		fit      uint64
		ok       bool
	}{
		{20000, 0, 31, false}, // no cap on awake interns: always a warning
		{20000, 31, 31, true},
		{20000, 32, 31, false},
		{1 << 20, 100, 2040, true},
		{1024, 1, 0, false},
	} {
		fit, ok := descriptorBudget(c.nofile, c.maxAwake, 256)
		if fit != c.fit || ok != c.ok {
			t.Errorf("nofile %d, %d awake: %d %v, want %d %v", c.nofile, c.maxAwake, fit, ok, c.fit, c.ok)
		}
	}
}
