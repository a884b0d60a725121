package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A wrong setting stops serve before it opens anything: the data
// directory stays as it was (here empty: no database, KEK or bootstrap
// file) and no key is printed. Before, a missing --kek-file and a bad
// --turn-rate were found after the database was made and its keys shown.
func TestServeChecksSettingsBeforeWriting(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"missing kek file", []string{"--kek-file", filepath.Join(t.TempDir(), "absent.json")}, "--kek-file"},
		{"turn rate", []string{"--turn-rate", "5/d"}, "--turn-rate"},
		{"exchange rate", []string{"--exchange-rate", "fast"}, "--exchange-rate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir() // empty, as an operator's new data directory
			cmd := exec.Command(os.Args[0], append([]string{"serve", "--listen", "127.0.0.1:0", "--provisioner", "remote", "--data-dir", dir}, c.args...)...)
			cmd.Env = cleanAdminEnv()
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err == nil {
				t.Fatalf("serve started with %v:\n%s", c.args, stdout.String())
			}
			if !strings.Contains(stderr.String(), c.want) {
				t.Errorf("the refusal does not name %s:\n%s", c.want, stderr.String())
			}
			if strings.Contains(stdout.String(), "key") || strings.Contains(stdout.String(), "Bootstrapped") {
				t.Errorf("serve printed keys before it refused:\n%s", stdout.String())
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				t.Errorf("serve refused to start but left %s in its data directory", e.Name())
			}
		})
	}
}
