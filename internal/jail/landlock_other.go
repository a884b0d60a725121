//go:build !linux

package jail

// LandlockABI is 0 off Linux.
func LandlockABI() int { return 0 }

// ErrNoLandlock: off Linux there is none.
var ErrNoLandlock = ErrUnsupported
