// Package buildinfo says which build of cohort is running, from what the Go
// toolchain stamped into the binary (runtime/debug.ReadBuildInfo): served
// at GET /version and printed by `cohort version`.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Unknown stands for a version or commit the binary does not carry (go
// test, go run, or a build outside a repository or with -buildvcs=false).
const Unknown = "devel"

// Info is the running build.
type Info struct {
	// Version is the main module's version: a tag, a pseudo-version, or
	// Unknown.
	Version string `json:"version"`
	// Commit is the VCS revision built (vcs.revision), or Unknown.
	Commit string `json:"commit"`
	// Modified: the work tree had uncommitted changes (vcs.modified).
	Modified bool `json:"modified"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"go"`
}

// Get reads the running binary's build information.
func Get() Info {
	info := Info{Version: Unknown, Commit: Unknown, GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	info := Info{Version: Unknown, Commit: Unknown, GoVersion: bi.GoVersion}
	if info.GoVersion == "" {
		info.GoVersion = runtime.Version()
	}
	// "(devel)" is what the toolchain writes when it knows no version.
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		info.Version = v
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if s.Value != "" {
				info.Commit = s.Value
			}
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String is the one line `cohort version` prints.
func (i Info) String() string {
	s := "cohort " + i.Version + " commit " + i.Commit
	if i.Modified {
		s += " (modified)"
	}
	return s + " " + i.GoVersion
}
