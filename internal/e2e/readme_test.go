package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// The README's examples, as written, against a real `cohort serve` (issue
// 29), and those of the docs it sends a reader to (readmeFiles). Every ```sh,
// ```ts and ```go block of these files carries a marker on the line before
// its fence, an HTML comment that GitHub does not show:
//
//	<!-- readme-test: NAME -->          the test runs the block, checks its output with readmeWant[NAME]
//	<!-- readme-test: skip: REASON -->  the test leaves it out, for the reason given
//
// so a new example is either run or says why not. Each shell block runs as a
// pasted one would: `bash -c` in a directory holding the server's .cohort/,
// and must exit 0 with nothing on stderr and its expected output; the whole
// list runs twice against the same server, because a user runs an example
// again. Two rewrites stand in for the user's machine: the server listens on
// a free port instead of 8080, and a `go` first on PATH maps
// `go run ./cmd/cohort` and `go install ./cmd/cohort` (and ./cmd/cohort-intern)
// to the binaries this package built from the same tree (everything else goes to the real go).
// The TypeScript blocks are compiled with the console's TypeScript against
// web/node_modules (openai-node pinned there) and client/typescript (built
// here, as npm install of it would) and run by node.

// readmeFiles are the files whose examples run, from the repository root.
var readmeFiles = []string{"README.md", "docs/clients.md", "docs/configuration.md", "docs/operations.md"}

type readmeBlock struct {
	file       string
	line       int // of the opening fence
	lang, body string
	name, skip string // from the marker
	marked     bool
}

var readmeMarker = regexp.MustCompile(`^<!-- readme-test: (.+?) -->$`)

// readmeWant is what each run block must print (regular expressions over
// its stdout), each pass.
var readmeWant = map[string][]string{
	"workspaces": {
		`\{"data":\{"id":"[^"]+","name":"Research Team"`, // 201, every field
		`"code":403`, // the workspace key may not create one
		`"code":400[^}]*slug|slug[^}]*"code":400`, // the bad slug, named
		`\{"data":\[\{`, // the Connect listing
	},
	"chat": {
		`"content":"[^"]*Hello there`,
		`"finish_reason":"tool_calls"`,
		`\\"title\\":\\"shell\\",\\"input\\":\\"echo hello from the sandbox\\"`, // in the arguments string
		`hello from the sandbox[^"]*\\n`,                                        // the command's output, after the allow
		`"finish_reason":"stop"`,
		`data: \[DONE\]`,
	},
	"install": {`(?m)^cohort `},
	"vault": {
		`"name":"github_token","hosts":\["api.github.com"\],"fingerprint":"sha256:`,
		`\{"data":\[\{"name":"github_token"`,
	},
	"federation": {
		`\[\{"id":"[^"]+","issuer_id":"[^"]+"[^\]]*"audience":"cohort"`,
		`"keys":\[\{`,
	},
	"admin": {
		`(?i)usage`,
		`"kind":"management"`,
	},
	"openai.ts": {
		`the intern asks: \{"kind":"permission","operation":"shell"`,
		`"input":"echo hello from node"`,
		`hello from node`,
	},
	"connect.ts": {
		`(?m)^[0-9a-f-]{36} \S+ cohort/demo running$`,
		`(?m)^NotFound `,
	},
	"client.go": {
		`(?m)^[0-9a-f-]{36} \S+ cohort/demo running$`,
		`the intern asks: \{"kind":"permission","operation":"shell"`,
		`hello from go\\n`,
		`You said: hello in the background`,
		`(?m)^run run_\S+ completed$`,
	},
}

func readmeBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	var blocks []readmeBlock
	for _, file := range readmeFiles {
		b, err := os.ReadFile(filepath.Join("..", "..", file))
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, markdownBlocks(file, string(b))...)
	}
	return blocks
}

// markdownBlocks are the fenced blocks of one file, with their markers.
func markdownBlocks(file, text string) []readmeBlock {
	lines := strings.Split(text, "\n")
	var blocks []readmeBlock
	for i := 0; i < len(lines); i++ {
		lang, ok := strings.CutPrefix(lines[i], "```")
		if !ok || lang == "" {
			continue
		}
		end := i + 1
		for end < len(lines) && lines[end] != "```" {
			end++
		}
		blk := readmeBlock{file: file, line: i + 1, lang: lang, body: strings.Join(lines[i+1:end], "\n") + "\n"}
		if i > 0 {
			if m := readmeMarker.FindStringSubmatch(lines[i-1]); m != nil {
				blk.marked = true
				if reason, ok := strings.CutPrefix(m[1], "skip:"); ok {
					blk.skip = strings.TrimSpace(reason)
				} else {
					blk.name = m[1]
				}
			}
		}
		blocks = append(blocks, blk)
		i = end
	}
	return blocks
}

func TestReadmeExamples(t *testing.T) {
	t.Parallel()
	blocks := readmeBlocks(t)
	var sh, ts, golang []readmeBlock
	named := map[string]bool{}
	for _, b := range blocks {
		if b.lang != "sh" && b.lang != "ts" && b.lang != "go" {
			continue
		}
		switch {
		case !b.marked:
			t.Errorf("%s:%d: a %s block without a marker: put <!-- readme-test: NAME --> (and its expected output in readmeWant) or <!-- readme-test: skip: why --> on the line before it", b.file, b.line, b.lang)
		case b.skip != "":
			continue
		case readmeWant[b.name] == nil:
			t.Errorf("%s:%d: block %q has no expected output in readmeWant", b.file, b.line, b.name)
		}
		named[b.name] = true
		switch b.lang {
		case "sh":
			sh = append(sh, b)
		case "ts":
			ts = append(ts, b)
		default:
			golang = append(golang, b)
		}
	}
	for name := range readmeWant {
		if !named[name] {
			t.Errorf("readmeWant[%q] names no block of %s", name, strings.Join(readmeFiles, ", "))
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	dir := t.TempDir()
	gw := startIn(t, dir, "gateway", []string{"COHORT_JAIL_ORPHAN_TIMEOUT=0"}, "serve", "--listen", "127.0.0.1:0")
	boot := readBootstrap(t, dir)
	// The README's reader runs its examples some time after the start; the
	// demo intern is awake by then.
	testutil.Eventually(t, wait, "the demo intern answers", func() bool {
		res := chat(t, gw, boot["workspace_key"], boot["intern_id"], user("warm up"))
		defer res.Body.Close()
		return res.StatusCode == 200
	})
	// The examples take the address from $API (the first block sets it,
	// a reader's terminal keeps it; each block here runs on its own).
	env := append(readmeEnv(t), "API="+gw.URL+"/api/v1")

	for pass := 1; pass <= 2; pass++ {
		for _, b := range sh {
			out := runReadmeBlock(t, pass, b, dir, env, "bash", "-c", strings.ReplaceAll(b.body, "http://127.0.0.1:8080", gw.URL))
			checkReadmeOutput(t, pass, b, out)
		}
	}

	// Go: each block is a main package built in this module (the client
	// package as a user's module would import it), run once.
	t.Run("go", func(t *testing.T) {
		goEnv := append(os.Environ(), "API="+gw.URL+"/api/v1", "WK="+boot["workspace_key"], "IN="+boot["intern_id"])
		for _, b := range golang {
			dir, err := os.MkdirTemp("testdata", "readme-go-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			body := strings.ReplaceAll(b.body, "http://127.0.0.1:8080", gw.URL)
			if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			checkReadmeOutput(t, 1, b, runReadmeBlock(t, 1, b, ".", goEnv, "go", "run", "./"+dir))
		}
	})

	t.Run("typescript", func(t *testing.T) {
		tsc, tsdir := prepareTypeScript(t)
		for _, b := range ts {
			body := strings.ReplaceAll(b.body, "http://127.0.0.1:8080", gw.URL)
			if err := os.WriteFile(filepath.Join(tsdir, b.name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		runReadmeBlock(t, 1, readmeBlock{file: "README.md", name: "tsc of the README's TypeScript"}, tsdir, env, "node", tsc, "-p", tsdir)
		tsEnv := append(env, "WK="+boot["workspace_key"], "IN="+boot["intern_id"])
		for _, b := range ts {
			js := filepath.Join(tsdir, "out", strings.TrimSuffix(b.name, ".ts")+".js")
			checkReadmeOutput(t, 1, b, runReadmeBlock(t, 1, b, tsdir, tsEnv, "node", js))
		}
	})
}

func readBootstrap(t *testing.T, dir string) map[string]string {
	t.Helper()
	c := &cluster{dataDir: filepath.Join(dir, ".cohort")}
	c.load(t)
	return map[string]string{"workspace_key": c.WK, "intern_id": c.Demo}
}

// readmeEnv is the user's shell: this environment without Cohort's settings,
// GOBIN or GOPATH (so `go install` lands in a GOPATH of the test's), and a
// PATH whose first `go` knows ./cmd/cohort as the built binary.
func readmeEnv(t *testing.T) []string {
	t.Helper()
	realGo, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	shims := t.TempDir()
	shim := `#!/bin/sh
# The README test's go: ./cmd/cohort (and cohort-intern) are the binaries the test built from this tree.
if [ "$1" = install ] && [ "$2" = ./cmd/cohort-intern ]; then
  bin="$("$README_GO" env GOPATH)/bin" && mkdir -p "$bin" && cp "$README_COHORT-intern" "$bin/cohort-intern"; exit
fi
if [ "$2" = ./cmd/cohort ]; then
  case "$1" in
  run) shift 2; exec "$README_COHORT" "$@" ;;
  install) bin="$("$README_GO" env GOPATH)/bin" && mkdir -p "$bin" && cp "$README_COHORT" "$bin/cohort"; exit ;;
  esac
fi
exec "$README_GO" "$@"
`
	if err := os.WriteFile(filepath.Join(shims, "go"), []byte(shim), 0o755); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range cleanEnv() {
		if !strings.HasPrefix(kv, "GOBIN=") && !strings.HasPrefix(kv, "GOPATH=") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	return append(env, "PATH="+shims+string(os.PathListSeparator)+os.Getenv("PATH"),
		"GOPATH="+t.TempDir(), "README_GO="+realGo, "README_COHORT="+cohortBin)
}

// runReadmeBlock runs one command for block b and returns its stdout; it
// fails the test on a non-zero exit or anything on stderr.
func runReadmeBlock(t *testing.T, pass int, b readmeBlock, dir string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*wait)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil || strings.TrimSpace(stderr.String()) != "" {
		t.Fatalf("pass %d, %s:%d (%s): %v\nstderr:\n%s\nstdout:\n%s", pass, b.file, b.line, b.name, err, stderr.String(), tail(stdout.String(), 3000))
	}
	return stdout.String()
}

func checkReadmeOutput(t *testing.T, pass int, b readmeBlock, out string) {
	t.Helper()
	for _, want := range readmeWant[b.name] {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("pass %d, %s:%d (%s): output lacks %s:\n%s", pass, b.file, b.line, b.name, want, tail(out, 3000))
		}
	}
}

// prepareTypeScript makes a directory where the README's TypeScript compiles
// as an outside program's would: the generated Connect code (web/src/gen, as
// protoc-gen-es writes it) in gen/, the packages of web/node_modules. It
// skips when those are not installed (`npm ci` in web/), and fails in CI.
func prepareTypeScript(t *testing.T) (tsc, dir string) {
	t.Helper()
	web, err := filepath.Abs(filepath.Join("..", "..", "web"))
	if err != nil {
		t.Fatal(err)
	}
	tsc = filepath.Join(web, "node_modules", "typescript", "bin", "tsc")
	_, errNode := exec.LookPath("node")
	_, errTSC := os.Stat(tsc)
	_, errSDK := os.Stat(filepath.Join(web, "node_modules", "openai", "package.json"))
	if err := errors.Join(errNode, errTSC, errSDK); err != nil {
		msg := fmt.Sprintf("node and web/node_modules (run npm ci in web/) are needed: %v", err)
		if os.Getenv("CI") != "" || os.Getenv("COHORT_REQUIRE_BROWSER") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir = t.TempDir()
	// web's packages (openai-node, TypeScript), and the repository's
	// @cohort-dev/client, built, as `npm install ./client/typescript`
	// would install it.
	mods := filepath.Join(dir, "node_modules")
	entries, err := os.ReadDir(filepath.Join(web, "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(mods, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Symlink(filepath.Join(web, "node_modules", e.Name()), filepath.Join(mods, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	pkg := filepath.Join(web, "..", "client", "typescript")
	build := exec.Command("node", filepath.Join(pkg, "node_modules", "typescript", "bin", "tsc"), "-p", pkg)
	if out, err := build.CombinedOutput(); err != nil {
		msg := fmt.Sprintf("build client/typescript (npm ci there first): %v\n%s", err, out)
		if os.Getenv("CI") != "" || os.Getenv("COHORT_REQUIRE_BROWSER") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if err := os.MkdirAll(filepath.Join(mods, "@cohort-dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(pkg, filepath.Join(mods, "@cohort-dev", "client")); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"package.json": `{"type": "module"}`,
		// web/ has no @types/node (it would change the console's own
		// types); the README's programs use this much of it.
		"node.d.ts": `declare const process: {env: Record<string, string | undefined>; stdout: {write(s: string): boolean}};`,
		"tsconfig.json": `{"compilerOptions": {"target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext",
  "lib": ["ES2022", "DOM"], "strict": true, "skipLibCheck": true, "rootDir": ".", "outDir": "out"},
 "include": ["*.ts"]}`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return tsc, dir
}
