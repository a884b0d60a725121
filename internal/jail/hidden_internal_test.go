package jail

import (
	"slices"
	"testing"
)

// hidden covers what a bind shows of the host, never the jail's own
// tmpfs mounts: a hidden /tmp (the binary's directory) covers only the
// binds inside it.
func TestHidden(t *testing.T) {
	binds := []Bind{{Src: "/usr", Dst: "/usr"}, {Src: "/tmp/data", Dst: "/tmp/data"}, {Src: "/srv/i/1", Dst: "/intern"}}
	cases := []struct {
		inherit bool
		hide    []string
		want    []string
	}{
		{false, []string{"/tmp"}, []string{"/tmp/data"}},
		{false, []string{"/tmp/"}, []string{"/tmp/data"}},
		{false, []string{"/tmp/x"}, nil},
		{false, []string{"/tmp/data/secret"}, []string{"/tmp/data/secret"}},
		{false, []string{"/dev/shm", "/proc"}, nil},
		{true, []string{"/dev/shm"}, []string{"/dev/shm"}}, // the caller's /dev
		{false, []string{"/srv/data", "/usr/local/cohort"}, []string{"/srv/data", "/usr/local/cohort"}},
		{false, []string{"/tmpfoo"}, []string{"/tmpfoo"}},
	}
	for _, c := range cases {
		got := hidden(&Spec{Inherit: c.inherit, Binds: binds, Hide: c.hide})
		if !slices.Equal(got, c.want) {
			t.Errorf("inherit=%v hide %v: %v, want %v", c.inherit, c.hide, got, c.want)
		}
	}
}
