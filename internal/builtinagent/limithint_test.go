package builtinagent

import (
	"strings"
	"testing"
)

// A shell command's status names the jail limit it hit; an ordinary
// failure names none.
func TestLimitHint(t *testing.T) {
	for code, want := range map[int]string{137: "memory limit", -1: "memory limit", 153: "largest-file limit", 1: "", 0: "", 130: ""} {
		got := limitHint(code)
		if want == "" && got != "" || want != "" && !strings.Contains(got, want) {
			t.Errorf("status %d: %q, want %q", code, got, want)
		}
	}
}
