package federation_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// TestExchangeRateLimitPerRelayedIntern: exchanges that reach the gateway
// through interns' jail relays (all from 127.0.0.1) are limited per
// intern. One intern using up its budget leaves another intern's, and a
// direct loopback client's, intact. (Before: one key, 127.0.0.1, for every
// intern and every loopback client.)
func TestExchangeRateLimitPerRelayedIntern(t *testing.T) {
	t.Parallel()
	p := newIDP(t)
	f := newFed(t, storetest.SQLite(t), p, func(s *server.Server) {
		s.Federation.Config.Limiter, _ = ratelimit.NewMemory(ratelimit.Rate{Events: 2, Period: time.Hour, Burst: 2}, nil)
	})
	relay, err := egress.New(egress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	relay.SetGateway(f.Server.Handler())
	jailOf := func(intern string) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go relay.Serve(intern, egress.KindGateway, c)
			}
		}()
		return ln.Addr().String()
	}
	tok := p.token(t, kidRSA, p.claims())
	via := func(relayAddr string) answer {
		t.Helper()
		res, err := http.Post("http://"+relayAddr+server.Prefix+"/oauth/token", "application/x-www-form-urlencoded",
			strings.NewReader(exchangeForm(tok, f.policyID)))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return answer{res.StatusCode, string(b), res.Header}
	}
	a, b := jailOf("intern-a"), jailOf("intern-b")
	issued(t, via(a))
	issued(t, via(a))
	expectError(t, via(a), 429, "invalid_request")
	issued(t, via(b))
	issued(t, f.exchange(t, tok)) // a client on loopback, not relayed
}
