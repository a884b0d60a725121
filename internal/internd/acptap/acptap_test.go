package acptap

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestTap: text chunks are taken in order with their model, other
// session/update kinds are dropped, and every other line (a long one
// included) reaches the SDK's side unchanged.
func TestTap(t *testing.T) {
	long := `{"jsonrpc":"2.0","id":7,"result":{"x":"` + strings.Repeat("a", 100<<10) + `"}}` + "\n"
	lines := []string{
		`{"jsonrpc":"2.0","id":1,"result":{}}` + "\n",
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hel"}},"_meta":{"cohort.dev/model":"m1"}}}` + "\n",
		`{"jsonrpc":"2.0","method": "session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"hm"},"_meta":{"cohort.dev/model":"m2"}}}}` + "\n",
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call","toolCallId":"t"}}}` + "\n",
		`{"jsonrpc":"2.0","id":2,"method":"session/request_permission","params":{"sessionId":"s1"}}` + "\n",
		long,
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"lo"}}}}`,
	}
	var got []Update
	tap, sdk := Start(strings.NewReader(strings.Join(lines, "")), func(u Update) { got = append(got, u) })
	passed, err := io.ReadAll(sdk)
	if err != nil {
		t.Fatal(err)
	}
	if want := lines[0] + lines[4] + long; string(passed) != want {
		t.Errorf("the SDK read %d bytes, want %d: %.200q", len(passed), len(want), passed)
	}
	want := []Update{{"s1", "hel", "m1", false}, {"s1", "hm", "m2", true}, {"s1", "lo", "", false}}
	if len(got) != len(want) {
		t.Fatalf("updates %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("update %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	// Everything read was handled: Settle returns at once.
	t0 := time.Now()
	tap.Settle()
	if d := time.Since(t0); d > 200*time.Millisecond {
		t.Errorf("Settle took %v with nothing left", d)
	}
}
