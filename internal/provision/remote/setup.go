package remote

import (
	"flag"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/provision"
)

func init() { provision.Register(kind{}) }

type kind struct{}

func (kind) Name() string { return Name }
func (kind) Usage() string {
	return "the operator runs each intern's daemon and registers it"
}
func (kind) Flags(*flag.FlagSet) provision.Setup { return setup{} }

// setup: remote daemons need nothing of the gateway's host.
type setup struct{ provision.NoHooks }

func (setup) Check(config.Config) error { return nil }
func (setup) Backend(provision.Env, *provision.Provisioner, provision.Agents) (provision.Backend, error) {
	return &Backend{}, nil
}
