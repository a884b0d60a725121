package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	t.Parallel()
	got := fromBuildInfo(&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123abc"}, {Key: "vcs.modified", Value: "true"}}})
	if want := (Info{Version: "v1.2.3", Commit: "0123abc", Modified: true, GoVersion: "go1.26.0"}); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if s := got.String(); s != "cohort v1.2.3 commit 0123abc (modified) go1.26.0" {
		t.Fatalf("String: %q", s)
	}
	got = fromBuildInfo(&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}})
	if got.Version != Unknown || got.Commit != Unknown || got.Modified {
		t.Fatalf("unstamped build: %+v", got)
	}
}
