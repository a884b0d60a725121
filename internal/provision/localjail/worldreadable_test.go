package localjail

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An operator's read-only bind holding something only its owner or group
// may read is refused at start, naming it; a world-readable one passes.
func TestReadOnlyBindMustBeWorldReadable(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	open := filepath.Join(dir, "open")
	os.MkdirAll(filepath.Join(open, "sub"), 0o755)
	os.WriteFile(filepath.Join(open, "sub", "ok.txt"), []byte("x"), 0o644)
	os.Symlink("/etc/shadow", filepath.Join(open, "link")) // a link is not followed
	if err := (JailConfig{ReadOnly: []string{open, filepath.Join(dir, "missing")}}).Check(); err != nil {
		t.Fatalf("world-readable binds: %v", err)
	}
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Join(open, "sub", "key.pem"), 0o600}, {filepath.Join(open, "sub", "group.conf"), 0o640}} {
		os.WriteFile(c.path, []byte("secret"), c.mode)
		os.Chmod(c.path, c.mode)
		err := (JailConfig{ReadOnly: []string{open}}).Check()
		if err == nil || !strings.Contains(err.Error(), c.path) {
			t.Errorf("a bind holding %s (%v): %v", c.path, c.mode, err)
		}
		os.Remove(c.path)
	}
	os.Chmod(filepath.Join(open, "sub"), 0o750)
	if err := (JailConfig{ReadOnly: []string{open}}).Check(); err == nil {
		t.Error("a bind holding a directory closed to other users passed")
	}
}
