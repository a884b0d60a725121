// Package backends links every backend into the binary that imports it:
// each registers itself with internal/provision (its init), as a
// database/sql driver does. A new backend is one package and one line here.
package backends

import (
	_ "github.com/cohort-dev/cohort/internal/provision/gvisor"
	_ "github.com/cohort-dev/cohort/internal/provision/kubepods"
	_ "github.com/cohort-dev/cohort/internal/provision/localjail"
	_ "github.com/cohort-dev/cohort/internal/provision/remote"
)
