//go:build linux && !amd64 && !arm64

package jail

// No filter is written for this architecture: a jail that asks for one
// fails to start (Spec.Seccomp = SeccompOff runs without).
var nativeSeccompArch seccompArch
