package provision

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/cohort-dev/cohort/internal/config"
)

// Backend hosts interns' daemons somewhere: jails on this machine
// (localjail), Pods of a cluster (kubepods), daemons an operator runs and
// registers (remote). It carries out; it never decides. The reconciler
// (Provisioner) alone decides from the database which intern's daemon must
// run, sleep or go, when to retry and what to evict, and calls the backend
// to make it so; it never knows which backend it drives. A new backend is
// a package implementing this interface and registering its Kind
// (registry.go), and one line in internal/provision/backends;
// docs/architecture.md draws the seam.
//
// The reconciler acts on one intern at a time per gateway (concurrent
// callers share one action), holding the backend's Claim for it.
type Backend interface {
	// Name is recorded in the row of every intern whose daemon this
	// backend started (store.Intern.Provisioner): a daemon recorded by
	// another backend is never adopted.
	Name() string
	// Open starts what the backend watches, until ctx ends; h.Changed asks
	// the reconciler for a pass soon (a daemon died, a Pod changed).
	Open(ctx context.Context, h Host) error
	// Observe reports what exists now: every daemon, started, starting or
	// left by a previous gateway, and the interns whose files are kept
	// without one. complete is false while the backend cannot see it all
	// (a cache still listing) or never can (remote): then the reconciler
	// does not take a missing daemon for a dead one.
	Observe() (daemons []Observed, complete bool)
	// Fingerprint names what a daemon for spec runs, as Observed.Runs
	// does: a daemon whose Runs differs from its intern's spec is replaced.
	Fingerprint(spec Spec) string
	// Claim makes this gateway the only one acting on the intern until
	// release; ErrBusy if another holds it. A backend whose daemons only
	// this gateway sees returns at once.
	Claim(ctx context.Context, id string) (release func(), err error)
	// Ensure makes the intern's daemon run spec and returns where it
	// listens and the secret it answers with. A daemon that already runs
	// spec with spec.Secret is kept (adopted, after a gateway restart);
	// any other is replaced by a new one, whose secret spec.Mint makes
	// (and records) before the daemon exists. The reconciler checks that
	// the daemon answers before the intern runs.
	Ensure(ctx context.Context, spec Spec) (Daemon, error)
	// Sleep ends the intern's daemon and keeps its files (sleep, suspend).
	Sleep(ctx context.Context, id string) error
	// Remove ends the intern's daemon and removes its files (delete).
	Remove(ctx context.Context, id string) error
	// Close lets go of the daemons as the gateway stops: it stops them, or
	// leaves them for the next gateway to adopt, as the backend's own
	// configuration says.
	Close()
}

// Host is what the reconciler offers its backend.
type Host struct {
	Log *slog.Logger
	// Changed asks for a reconcile pass soon; it never blocks.
	Changed func()
	// Check asks the daemon at url once whether it answers with secret.
	Check func(ctx context.Context, url, secret string) error
	// Route makes this gateway reach the daemon address addr ("host:port"
	// of its URL) through the unix socket at path instead, until undo: one
	// hop fewer where the address only forwards to that socket (gvisor).
	// Anything else dialing addr still gets there.
	Route func(addr, path string) (undo func())
}

// Spec is what an intern's daemon runs, from its row.
type Spec struct {
	ID, Model, Agent string
	// Limits are the intern's own (each backend applies them within the
	// operator's).
	Limits config.InternLimits
	// URL and Secret are the daemon the row records for this backend (""
	// when none); SecretTag names Secret without revealing it.
	URL, Secret, SecretTag string
	// Mint makes the secret of a new daemon and records it (wrapped) in the
	// row before the daemon exists, so that whoever acts next finds it.
	// ErrNotWanted: the intern should no longer be awake.
	Mint func(ctx context.Context) (secret, tag string, err error)
}

// Daemon is an intern's daemon as Ensure left it.
type Daemon struct {
	URL, Secret string
	// Log are attributes of the "intern daemon running" line (pid,
	// jailed, adopted …).
	Log []any
}

// Observed is one intern's daemon (or its kept files) as the backend sees it.
type Observed struct {
	ID string
	// Running: a daemon exists (up, starting, or left by a previous
	// gateway); false: only the intern's files are kept.
	Running bool
	// Ready: it answers at URL.
	Ready bool
	URL   string
	// Runs is Fingerprint of the spec it was started with.
	Runs string
	// Since is when it became ready: its idle time counts from there.
	Since time.Time
}

// Errors a backend returns to the reconciler.
var (
	// ErrBusy: another gateway acts on the intern now; the reconciler
	// looks again shortly.
	ErrBusy = errors.New("another gateway replica is acting on this intern")
	// ErrUnhosted: this backend cannot start the intern's daemon (remote:
	// the operator registers it); the intern waits, nothing is retried.
	ErrUnhosted = errors.New("no daemon is registered for this intern")
	// ErrNotWanted: Mint found the intern no longer awake.
	ErrNotWanted = errors.New("the intern is no longer awake")
)
