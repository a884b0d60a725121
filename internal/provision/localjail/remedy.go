package localjail

import (
	"errors"

	"github.com/cohort-dev/cohort/internal/jail"
)

// Remedy is what an operator can do about a ProbeJail that failed with
// err, for the message serve exits with.
func Remedy(err error) string {
	const unsafe = "only if every workspace key holder may read this gateway's keys, start with --unsafe-shared-host"
	if errors.Is(err, jail.ErrSubIDs) {
		// The namespaces were fine: err names what is missing.
		return "Or, " + unsafe
	}
	return "The local provisioner runs every intern in a jail of its own (user, mount, PID and network namespaces) and refuses to run them otherwise. " +
		"Run the gateway as root, or allow unprivileged user namespaces; or, " + unsafe
}
