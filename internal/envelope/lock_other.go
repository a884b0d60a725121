//go:build !unix

package envelope

// lockFile is a no-op where flock does not exist: run one rotation at a
// time there.
func lockFile(string) (func(), error) { return func() {}, nil }
