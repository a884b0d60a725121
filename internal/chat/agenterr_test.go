package chat_test

import (
	"strings"
	"testing"

	"github.com/uptrace/bun"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// The agent's own words, as the daemon puts them in its refusal (issue 29),
// reach the chat caller in the 502 body with reason turn_failed, whether
// the daemon refuses the call or fails the turn as its first event.
func TestAgentRefusalMessageReachesCaller(t *testing.T) {
	const words = "the agent refused a new session: model gpt-9 is not available"
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := newEnv(t, db)
		for _, sc := range []script{
			events(apierr.ToConnect(apierr.New(502, "turn_failed", "%s", words))),
			events(nil, finishedEv("", &interndv1.Finished{Reason: interndv1.Finished_REASON_ERROR, Code: 502, ErrorReason: "turn_failed", Message: words})),
		} {
			e.d.set(sc, sc)
			status, body, _ := e.chat(t, userBody("hi"))
			got := wantRefusal(t, status, body, 502, "turn_failed")
			if got.Error.Message != words {
				t.Fatalf("message %q, want the agent's words %q", got.Error.Message, words)
			}
			if !strings.Contains(string(got.Error.Metadata), "turn_failed") {
				t.Fatalf("metadata %s", got.Error.Metadata)
			}
			e.d.waitEnded(t)
		}
	})
}
