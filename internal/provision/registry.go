package provision

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/egress"
)

// Backends register themselves here, as database/sql drivers do: each
// backend package registers its Kind from init, and the gateway imports
// internal/provision/backends, which imports them all. `serve` looks the
// kind the operator names (--provisioner) up once; nothing outside
// internal/provision names a backend.

// A kind's Name is the value operators type (local, kubernetes, remote),
// its package named for what it provides (localjail, kubepods, remote):
// each package's Name constant is the one place that maps the two, and
// the default kind is the one registered with RegisterDefault (ADR 0961).

// A Kind is a backend as the operator names it.
type Kind interface {
	// Name is the value of --provisioner that selects it.
	Name() string
	// Usage is one line for --provisioner's help.
	Usage() string
	// Flags declares the kind's own settings on fs (every kind's flags are
	// declared, so help lists them all) and returns them, read once fs is
	// parsed. Only the selected kind's Setup is then used.
	Flags(fs *flag.FlagSet) Setup
}

// Setup is one kind's settings, and the steps of bringing its backend up
// in the order the gateway takes them.
type Setup interface {
	// Check validates the settings (and cfg as this kind reads it) before
	// anything is written or opened.
	Check(cfg config.Config) error
	// Prepare readies the machine or cluster once the gateway listens and
	// before its database is opened (relays, a probe that this machine
	// can host interns): a gateway that cannot host them writes nothing.
	// The returned function closes what it opened.
	Prepare(ctx context.Context, env Env) (func(), error)
	// Backend builds the backend p drives, over env (Prepare's, when it
	// ran) and the agents ag names.
	Backend(env Env, p *Provisioner, ag Agents) (Backend, error)
	// Routes wraps the gateway's API handler with what the backend's
	// daemons reach beside it (a Pods' model relay).
	Routes(api http.Handler) http.Handler
	// Serve hands the gateway's finished handler to what the backend
	// serves it through in process (the jails' gateway relays), before
	// any daemon starts.
	Serve(h http.Handler)
	// Observe sets the backend's metrics hooks (each may be nil), before
	// Backend.
	Observe(h Hooks)
	// Warnings are what the operator should know at start (a limit this
	// host does not enforce).
	Warnings() []string
	// Unsafe, when set, is logged and reported by /readyz for as long as
	// the gateway runs (interns unjailed).
	Unsafe() string
	// WakeTimeout bounds a wake (0: the provisioner's default).
	WakeTimeout() time.Duration
}

// Env is what a backend's setup is given of the gateway.
type Env struct {
	Config config.Config
	Log    *slog.Logger
	// Listen is the gateway's listener; GatewayURL where daemons on this
	// machine reach its API.
	Listen     net.Addr
	GatewayURL string
	// APIPrefix is the path of the API on the gateway's listener.
	APIPrefix string
	// SecretsDoor, where the gateway has a vault (not in Prepare), gives
	// a backend's internet relays the vault's proxy door (ADR 0931): the
	// certificate of the CA its programs are to trust, and the door.
	SecretsDoor func() (caPEM string, door egress.Secrets, err error)
}

// Hooks are the metrics a backend may report to.
type Hooks struct {
	// KubeCall counts a call to a cluster's API.
	KubeCall func(verb, resource string, code int)
}

var (
	kindsMu     sync.Mutex
	kinds       = map[string]Kind{}
	defaultKind string
)

// Register makes a kind selectable; a second kind of one name panics.
func Register(k Kind) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	if _, dup := kinds[k.Name()]; dup {
		panic("provision: backend " + k.Name() + " registered twice")
	}
	kinds[k.Name()] = k
}

// RegisterDefault is Register for the kind --provisioner selects when
// given none; a second default panics.
func RegisterDefault(k Kind) {
	Register(k)
	kindsMu.Lock()
	defer kindsMu.Unlock()
	if defaultKind != "" {
		panic("provision: two default backends, " + defaultKind + " and " + k.Name())
	}
	defaultKind = k.Name()
}

// Kinds are the registered kinds by name.
func Kinds() []Kind {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	out := make([]Kind, 0, len(kinds))
	for _, k := range kinds {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// Lookup is the kind of name, or an error naming the ones there are.
func Lookup(name string) (Kind, error) {
	kindsMu.Lock()
	k, ok := kinds[name]
	kindsMu.Unlock()
	if ok {
		return k, nil
	}
	var names []string
	for _, k := range Kinds() {
		names = append(names, k.Name())
	}
	return nil, fmt.Errorf("--provisioner must be %s, not %q", orList(names), name)
}

// Flags declares every kind's flags on fs and --provisioner itself (whose
// default is def, or the default kind when def is empty); the returned
// func gives the selected kind's setup once fs is parsed.
func Flags(fs *flag.FlagSet, def string) func() (Setup, string, error) {
	if def == "" {
		kindsMu.Lock()
		def = defaultKind
		kindsMu.Unlock()
	}
	var usage []string
	setups := map[string]Setup{}
	for _, k := range Kinds() {
		usage = append(usage, k.Name()+": "+k.Usage())
		setups[k.Name()] = k.Flags(fs)
	}
	name := config.String(fs, "provisioner", def, strings.Join(usage, "; "))
	return func() (Setup, string, error) {
		if _, err := Lookup(*name); err != nil {
			return nil, *name, err
		}
		return setups[*name], *name, nil
	}
}

// DefaultSetup is a kind's setup with its flags at their defaults (tests,
// and New when its caller gave none).
func DefaultSetup(name string) (Setup, error) {
	k, err := Lookup(name)
	if err != nil {
		return nil, err
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return k.Flags(fs), nil
}

func orList(names []string) string {
	switch len(names) {
	case 0:
		return "a registered backend"
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// NoHooks is embedded by setups that need none of the optional steps.
type NoHooks struct{}

func (NoHooks) Prepare(context.Context, Env) (func(), error) { return func() {}, nil }
func (NoHooks) Routes(api http.Handler) http.Handler         { return api }
func (NoHooks) Serve(http.Handler)                           {}
func (NoHooks) Observe(Hooks)                                {}
func (NoHooks) Warnings() []string                           { return nil }
func (NoHooks) Unsafe() string                               { return "" }
func (NoHooks) WakeTimeout() time.Duration                   { return 0 }
