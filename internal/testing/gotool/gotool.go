// Package gotool builds the executables the tests run beside Cohort (a
// kube-apiserver, runsc) from a module of their own under tools/, by
// `go tool -modfile=tools/<dir>/go.mod -n <tool>`: the first build on a
// machine takes minutes, later ones find it in the Go build cache.
package gotool

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const module = "github.com/cohort-dev/cohort"

// Build returns the paths of tools, built from tools/<dir>/go.mod with
// env added to the go command's environment (CGO_ENABLED=0, say: the
// build cache keys on it, so .ci/run's build must use the same).
func Build(dir string, env []string, tools ...string) ([]string, error) {
	root, err := repoRoot(dir)
	if err != nil {
		return nil, err
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return nil, err
	}
	// Test binaries of several packages run at once under `go test ./...`:
	// one builds while the others wait on this lock, then find the build
	// cached (two builds at once on a small machine each took longer than
	// the suite's timeout).
	unlock, err := buildLock(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var paths []string
	for _, tool := range tools {
		cmd := exec.Command(gobin, "tool", "-modfile="+filepath.Join(root, "tools", dir, "go.mod"), "-n", tool)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		start := time.Now()
		stop := progress(3*time.Second, 30*time.Second, func() {
			fmt.Fprintf(os.Stderr, "gotool: building %s into the Go build cache (%s so far; the first build on a machine takes minutes)\n",
				tool, time.Since(start).Round(time.Second))
		})
		out, err := cmd.Output()
		stop()
		if err != nil {
			return nil, fmt.Errorf("go tool -modfile=tools/%s/go.mod -n %s: %v: %s", dir, tool, err, strings.TrimSpace(stderr.String()))
		}
		path := strings.TrimSpace(string(out))
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("go tool -n %s: %v", tool, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// buildLock takes a lock shared by every process of this machine's user,
// in the Go build cache's directory, printing while it waits for another
// test binary's build.
func buildLock(dir string) (unlock func(), err error) {
	cache, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOCACHE: %w", err)
	}
	path := filepath.Join(strings.TrimSpace(string(cache)), "cohort-tools-"+dir+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		start := time.Now()
		stop := progress(0, 30*time.Second, func() {
			fmt.Fprintf(os.Stderr, "gotool: waiting for another test binary building tools/%s (%s so far)\n",
				dir, time.Since(start).Round(time.Second))
		})
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		stop()
		if err != nil {
			f.Close()
			return nil, err
		}
	}
	return func() { f.Close() }, nil
}

// progress calls say after first, then every period, until stop is called
// (stderr, so that a run of one package shows it as it happens, not when
// the test ends).
func progress(first, period time.Duration, say func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		timer := time.NewTimer(first)
		defer timer.Stop()
		for {
			select {
			case <-done:
				return
			case <-timer.C:
				say()
				timer.Reset(period)
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done) }) }
}

// repoRoot walks up from the working directory (a test's package
// directory) to the go.mod of this module, which has tools/<dir>.
func repoRoot(dir string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if f, err := os.Open(filepath.Join(wd, "go.mod")); err == nil {
			s := bufio.NewScanner(f)
			s.Scan()
			f.Close()
			if strings.TrimSpace(strings.TrimPrefix(s.Text(), "module")) == module {
				if _, err := os.Stat(filepath.Join(wd, "tools", dir, "go.mod")); err != nil {
					return "", err
				}
				return wd, nil
			}
		}
		parent := filepath.Dir(wd)
		if parent == wd {
			return "", errors.New("no go.mod of " + module + " above the working directory")
		}
		wd = parent
	}
}
