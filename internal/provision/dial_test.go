package provision_test

import (
	"testing"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
)

// TestDaemonCallsSendTheirBodyAtOnce guards the daemon client's
// h2coalesce.Dialer, which holds a request's headers until its body is
// written: that is only safe while no daemon method streams from the
// client (its headers could wait for a message not yet sent).
func TestDaemonCallsSendTheirBodyAtOnce(t *testing.T) {
	svc := interndv1.File_cohort_internd_v1_internd_proto.Services().ByName("InternDaemonService")
	if svc == nil {
		t.Fatal("InternDaemonService not found")
	}
	ms := svc.Methods()
	for i := range ms.Len() {
		if m := ms.Get(i); m.IsStreamingClient() {
			t.Errorf("%s streams from the client: the daemon client's coalescing dialer would hold its headers", m.FullName())
		}
	}
}
