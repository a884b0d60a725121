package internd

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	acp "github.com/coder/acp-go-sdk"
)

// maxPermissionInput bounds the tool input carried in a permission pause, so
// an agent's multi-megabyte diff cannot swell every pause chunk.
const maxPermissionInput = 4096

// permissionInput renders what a tool call would do as text for the caller
// who must approve it: the shell command, a URL, the agent's other raw input,
// file diffs and the files it touches. Environment maps in the raw input are
// left out: they may hold credentials and are not what is being asked.
func permissionInput(tc acp.ToolCallUpdate) string {
	var parts []string
	seen := func(s string) bool {
		for _, p := range parts {
			if strings.Contains(p, s) {
				return true
			}
		}
		return false
	}
	if s := rawInputText(tc.RawInput); s != "" {
		parts = append(parts, s)
	}
	for _, c := range tc.Content {
		switch {
		case c.Diff != nil:
			parts = append(parts, diffText(c.Diff))
		case c.Content != nil && c.Content.Content.Text != nil:
			t := strings.TrimSpace(c.Content.Content.Text.Text)
			if t != "" && !seen(strings.TrimPrefix(t, "$ ")) {
				parts = append(parts, t)
			}
		}
	}
	for _, l := range tc.Locations {
		if l.Path == "" || seen(l.Path) {
			continue
		}
		if l.Line != nil {
			parts = append(parts, fmt.Sprintf("%s:%d", l.Path, *l.Line))
		} else {
			parts = append(parts, l.Path)
		}
	}
	return truncateInput(strings.Join(parts, "\n"), maxPermissionInput)
}

// rawInputText picks the command or URL out of an agent's raw input, and
// falls back to the input as indented JSON without environment keys.
func rawInputText(raw any) string {
	switch v := raw.(type) {
	case nil:
		return ""
	case string:
		return v
	case map[string]any:
		if s := commandText(v["command"]); s != "" {
			if args := commandText(v["args"]); args != "" {
				s += " " + args
			}
			return s
		}
		for _, k := range []string{"cmd", "url", "uri"} {
			if s, ok := v[k].(string); ok && s != "" {
				return s
			}
		}
		clean := make(map[string]any, len(v))
		for k, x := range v {
			switch strings.ToLower(k) {
			case "env", "environment", "headers":
				continue
			}
			clean[k] = x
		}
		if len(clean) == 0 {
			return ""
		}
		raw = clean
	}
	b, err := json.MarshalIndent(raw, "", "  ")
	if err != nil {
		return ""
	}
	return string(b)
}

func commandText(v any) string {
	switch c := v.(type) {
	case string:
		return c
	case []any:
		words := make([]string, 0, len(c))
		for _, w := range c {
			if s, ok := w.(string); ok {
				words = append(words, s)
			}
		}
		return strings.Join(words, " ")
	}
	return ""
}

// diffText shows a file edit as the path and the removed and added lines.
func diffText(d *acp.ToolCallContentDiff) string {
	var b strings.Builder
	b.WriteString("--- " + d.Path + "\n+++ " + d.Path + "\n")
	if d.OldText != nil && *d.OldText != "" {
		for _, l := range strings.Split(strings.TrimSuffix(*d.OldText, "\n"), "\n") {
			b.WriteString("-" + l + "\n")
		}
	}
	for _, l := range strings.Split(strings.TrimSuffix(d.NewText, "\n"), "\n") {
		b.WriteString("+" + l + "\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// truncateInput cuts s to at most max bytes on a rune boundary and says so.
func truncateInput(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("\n… [truncated: %d of %d bytes shown]", cut, len(s))
}
