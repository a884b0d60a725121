package client_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// TestTypeScriptPackage packs client/typescript (npm pack builds it),
// installs the tarball into a fresh Node project, as a user would, and
// runs a script against a real gateway: the interns listed with the key,
// the API's errors as Connect codes, a stream that carries the key.
func TestTypeScriptPackage(t *testing.T) {
	npm, err := exec.LookPath("npm")
	if err == nil {
		_, err = os.Stat(filepath.Join("typescript", "node_modules"))
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the TypeScript package cannot be built: %v (.ci/run runs npm ci in client/typescript)", err)
		}
		t.Skipf("SKIPPING: npm or client/typescript/node_modules missing (cd client/typescript && npm ci): %v", err)
	}
	run := func(dir string, env []string, name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	packs := t.TempDir()
	run("typescript", nil, npm, "pack", "--silent", "--pack-destination", packs)
	tgz, _ := filepath.Glob(filepath.Join(packs, "*.tgz"))
	if len(tgz) != 1 {
		t.Fatalf("npm pack made %v", tgz)
	}

	project := t.TempDir()
	os.WriteFile(filepath.Join(project, "package.json"), []byte(`{"name":"fresh","private":true,"type":"module"}`), 0o644)
	run(project, nil, npm, "install", "--no-audit", "--no-fund", "--loglevel=error", tgz[0])
	script := `import { Code, ConnectError } from "@connectrpc/connect";
import { createCohortClient } from "@cohort-dev/client";
const c = createCohortClient(process.env.API, process.env.WK);
for (const i of (await c.interns.listInterns({})).interns) console.log("intern", i.id);
try { await c.interns.getIntern({ id: "00000000-0000-4000-8000-000000000000" }); } catch (e) { console.log("get", Code[ConnectError.from(e).code]); }
try { for await (const r of c.chat.streamChatCompletion({ internId: process.env.IN, messages: [{ role: "user", content: "hi" }] })) {} }
catch (e) { console.log("stream", Code[ConnectError.from(e).code]); }
`
	os.WriteFile(filepath.Join(project, "main.mjs"), []byte(script), 0o644)

	e := testenv.New(t, storetest.SQLite(t))
	out := run(project, []string{"API=" + e.HTTP.URL + "/api/v1", "WK=" + e.WorkspaceKey, "IN=" + e.InternID}, "node", "main.mjs")
	if !strings.Contains(out, "intern "+e.InternID) || !strings.Contains(out, "get NotFound") {
		t.Fatalf("the package's client: %s", out)
	}
	// The intern has no daemon here: the stream is refused for that, never
	// for a missing credential.
	if !strings.Contains(out, "stream ") || strings.Contains(out, "stream Unauthenticated") {
		t.Fatalf("the package's stream: %s", out)
	}
}
