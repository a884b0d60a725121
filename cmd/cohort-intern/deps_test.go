package main

import (
	"os/exec"
	"strings"
	"testing"
)

// forbidden are packages of the gateway (and the libraries only it needs):
// linking one puts its package initializers into every process of every
// jail, the memory this binary exists to save.
var forbidden = []string{
	"github.com/cohort-dev/cohort/internal/provision",
	"github.com/cohort-dev/cohort/internal/server",
	"github.com/cohort-dev/cohort/internal/store",
	"github.com/cohort-dev/cohort/internal/envelope",
	"github.com/cohort-dev/cohort/internal/vault",
	"github.com/cohort-dev/cohort/internal/interns",
	"github.com/cohort-dev/cohort/internal/metrics",
	"github.com/cohort-dev/cohort/internal/egress",
	"github.com/cohort-dev/cohort/internal/federation",
	"github.com/cohort-dev/cohort/internal/webhooks",
	"github.com/cohort-dev/cohort/internal/chat",
	"github.com/cohort-dev/cohort/internal/turn",
	"github.com/cohort-dev/cohort/internal/auth",
	"cel.dev/cel-go",
	"github.com/google/cel-go",
	"github.com/prometheus/",
	"github.com/tink-crypto/",
	"github.com/uptrace/bun",
	"k8s.io/",
	"sigs.k8s.io/",
	"modernc.org/sqlite",
	"github.com/jackc/pgx",
	"github.com/redis/",
	"github.com/go-redis/",
}

// The binary of the jail links none of the gateway.
func TestLinksNoGatewayPackage(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 {
		t.Fatalf("go list -deps gave %d packages: %q", len(deps), out)
	}
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, strings.TrimSuffix(f, "/")+"/") {
				t.Errorf("cmd/cohort-intern links %s (forbidden: %s)", d, f)
			}
		}
	}
}
