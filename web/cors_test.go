package web_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/cohort-dev/cohort/internal/testing/browsertest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// TestCrossOriginClient: a page on an origin --cors-allow-origins lists
// calls the Connect and REST doors with fetch, as a browser client would
// (Authorization and Connect's headers, so preflighted), and reads the
// answers; a page on any other origin is blocked by the browser.
func TestCrossOriginClient(t *testing.T) {
	t.Parallel()
	page := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, "<!doctype html><title>client</title><p>client</p>")
	})
	listed, other := httptest.NewServer(page), httptest.NewServer(page)
	t.Cleanup(listed.Close)
	t.Cleanup(other.Close)
	cfg := testenv.Config()
	cfg.Server.CORSAllowOrigins = []string{listed.URL}
	e := testenv.NewConfig(t, storetest.SQLite(t), cfg)

	script := fmt.Sprintf(`(async () => {
		const auth = {"Authorization": "Bearer %s"};
		const out = [];
		for (const [url, init] of [
			[%q, {method: "POST", headers: {...auth, "Content-Type": "application/json", "Connect-Protocol-Version": "1", "Connect-Timeout-Ms": "10000"}, body: "{}"}],
			[%q, {method: "POST", headers: {...auth, "Content-Type": "application/json"}, body: JSON.stringify({name: "from another origin"})}],
		]) {
			try {
				const r = await fetch(url, init);
				out.push(r.status + " " + await r.text());
			} catch (e) {
				out.push("blocked: " + e.name);
			}
		}
		return out;
	})()`, e.ManagementKey, e.URL+"/cohort.v1.WorkspaceService/ListWorkspaces", e.URL+"/workspaces")

	b := browsertest.New(t, 1280, 800)
	b.Do(t, chromedp.Navigate(listed.URL+"/"), chromedp.WaitVisible(css("p")))
	got := browsertest.Get(t, b, chromedp.Evaluate[[]string](script, chromedp.EvalAwaitPromise))
	if len(got) != 2 || !strings.HasPrefix(got[0], "200 ") || !strings.Contains(got[0], `"Default"`) ||
		!strings.HasPrefix(got[1], "201 ") || !strings.Contains(got[1], "from another origin") {
		t.Fatalf("from the listed origin: %q", got)
	}
	b.NoErrors(t)

	b2 := browsertest.New(t, 1280, 800)
	b2.Do(t, chromedp.Navigate(other.URL+"/"), chromedp.WaitVisible(css("p")))
	got = browsertest.Get(t, b2, chromedp.Evaluate[[]string](script, chromedp.EvalAwaitPromise))
	if len(got) != 2 || got[0] != "blocked: TypeError" || got[1] != "blocked: TypeError" {
		t.Fatalf("from another origin: %q", got)
	}
	// Nothing was created from there: the preflight stopped the POST.
	if status, body, _ := e.Do(t, "POST", "/cohort.v1.WorkspaceService/ListWorkspaces", e.ManagementKey, "application/json", "{}"); status != 200 || strings.Count(body, "from another origin") != 1 {
		t.Fatalf("%d %s", status, body)
	}
}
