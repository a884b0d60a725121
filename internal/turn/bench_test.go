package turn

import (
	"context"
	"testing"
	"time"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/lookahead"
)

// BenchmarkNext measures what the stream itself does per text event: the
// event's arrival noted against the event timeout, the event turned into
// its chunk, the chunk queued and taken (ns/op and allocs/op per chunk;
// the daemon's receive is a function returning a ready event, so Connect,
// HTTP/2 and the caller's write are not in it). ADR 0975.
func BenchmarkNext(b *testing.B) {
	ev := &interndv1.RunEvent{Model: "m", Event: &interndv1.RunEvent_Text{Text: &interndv1.TextDelta{Text: "token 000042 "}}}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Stream{svc: &Service{}, ctx: ctx, cancel: cancel, id: "chatcmpl-x", created: 1, look: &lookahead.Body{},
		roleSent: true, recv: func() (*interndv1.RunEvent, error) { return ev, nil }}
	s.arm(time.Minute)
	defer s.Close()
	b.ReportAllocs()
	for b.Loop() {
		c, err := s.Next()
		if err != nil || c.GetChoices()[0].GetDelta().GetContent() == "" {
			b.Fatal(c, err)
		}
	}
}
