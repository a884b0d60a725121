package localjail

import (
	"io"
	"log/slog"

	"github.com/cohort-dev/cohort/internal/config"
)

// What another backend that holds the same jail in another wall (gVisor's
// sandboxes, internal/provision/gvisor) shares with this one: the jail's
// settings and relays, and each intern's DaemonJail, so that what an
// intern's sandbox contains is defined once (ADR 0981).

// DaemonJail is the jail of the intern's daemon as this backend would
// start it (b.Jail set): its agent, flags, limits and relays.
func (b *Backend) DaemonJail(id, model, agent string, own config.InternLimits, hostDir string, self []string) (DaemonJail, error) {
	return b.daemonJail(id, model, agent, own, hostDir, self)
}

// ForwardLogs copies a daemon's log lines into the gateway's log, as this
// backend does its jails'.
func ForwardLogs(log *slog.Logger, id string, r io.Reader) { forwardLogs(log, id, r) }
