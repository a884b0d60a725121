package internd

import (
	"strings"
	"testing"

	acp "github.com/coder/acp-go-sdk"
)

func TestPermissionInput(t *testing.T) {
	old := "a\nb\n"
	line := 3
	for _, c := range []struct {
		name string
		tc   acp.ToolCallUpdate
		want string
	}{
		{"shell argv", acp.ToolCallUpdate{RawInput: map[string]any{"command": []any{"rm", "-rf", "/tmp/x"}}}, "rm -rf /tmp/x"},
		{"fetch", acp.ToolCallUpdate{RawInput: map[string]any{"url": "https://example.com/a"}}, "https://example.com/a"},
		{"edit", acp.ToolCallUpdate{
			Content:   []acp.ToolCallContent{acp.ToolDiffContent("/w/f.txt", "a\nc\n", old)},
			Locations: []acp.ToolCallLocation{{Path: "/w/f.txt"}, {Path: "/w/g.txt", Line: &line}},
		}, "--- /w/f.txt\n+++ /w/f.txt\n-a\n-b\n+a\n+c\n/w/g.txt:3"},
		{"other raw input, env left out", acp.ToolCallUpdate{RawInput: map[string]any{"pattern": "x", "env": map[string]any{"TOKEN": "s3cret"}}}, "{\n  \"pattern\": \"x\"\n}"},
		{"nothing", acp.ToolCallUpdate{}, ""},
	} {
		if got := permissionInput(c.tc); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
	big := permissionInput(acp.ToolCallUpdate{RawInput: map[string]any{"command": "echo " + strings.Repeat("é", 5000)}})
	if len(big) > maxPermissionInput+64 || !strings.Contains(big, "[truncated: ") || !strings.HasPrefix(big, "echo é") {
		t.Errorf("not bounded: %d bytes, tail %q", len(big), big[len(big)-60:])
	}
}
