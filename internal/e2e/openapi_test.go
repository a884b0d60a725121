package e2e_test

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"sync"
	"testing"

	"github.com/cohort-dev/cohort/internal/openapi/openapitest"
)

// gateways maps the host of each running gateway to the test that
// started it: the test a response that breaks the OpenAPI document fails.
var gateways sync.Map

// checkOpenAPI makes every client of these tests (http.DefaultTransport,
// so http.DefaultClient and the OpenAI SDK's, and hangUp) check the
// gateways' REST answers against the OpenAPI document (ADR 0901).
// Other hosts (daemons, receivers, Prometheus) are not checked.
func checkOpenAPI() error {
	c, err := openapitest.Default()
	if err != nil {
		return err
	}
	wrap := func(base http.RoundTripper) http.RoundTripper {
		return &openapitest.Transport{Base: base, Checker: c, For: func(req *http.Request) func(string) {
			v, ok := gateways.Load(req.URL.Host)
			if !ok {
				return nil
			}
			t := v.(testing.TB)
			return func(msg string) { t.Errorf("%s", msg) }
		}}
	}
	http.DefaultTransport = wrap(http.DefaultTransport)
	hangUp.Transport = wrap(hangUp.Transport)
	return nil
}

// watchGateway checks the answers of p, a gateway, for t's lifetime.
func watchGateway(t testing.TB, p *proc) {
	u, err := url.Parse(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	gateways.Store(u.Host, t)
	t.Cleanup(func() { gateways.Delete(u.Host) })
}

// openAPISummary says how many answers were checked, so that a run whose
// clients bypassed the check shows it.
func openAPISummary() {
	if c, _ := openapitest.Default(); c != nil {
		fmt.Fprintf(os.Stderr, "e2e: %d REST answers of the gateways held to an operation of the OpenAPI document\n", c.Checked())
	}
}
