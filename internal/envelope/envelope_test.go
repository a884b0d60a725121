package envelope_test

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cohort-dev/cohort/internal/envelope"
)

func TestWrapUnwrapAndBinding(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "kek.json")
	k, err := envelope.LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("kek file mode %v, want 0600", st.Mode().Perm())
	}
	secret := []byte("data key material")
	ct, err := k.Wrap(secret, []byte("vault:a"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(ct, secret) {
		t.Fatal("wrapped material contains the plaintext")
	}
	pt, err := k.Unwrap(ct, []byte("vault:a"))
	if err != nil || !bytes.Equal(pt, secret) {
		t.Fatalf("unwrap: %q %v", pt, err)
	}
	if _, err := k.Unwrap(ct, []byte("vault:b")); err != envelope.ErrUnwrap {
		t.Fatalf("other associated data: want ErrUnwrap, got %v", err)
	}
	ct[len(ct)-1] ^= 1
	if _, err := k.Unwrap(ct, []byte("vault:a")); err != envelope.ErrUnwrap {
		t.Fatalf("tampered: want ErrUnwrap, got %v", err)
	}
	// Loading again gives the same key.
	k2, err := envelope.LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	ct2, _ := k.Wrap(secret, nil)
	if _, err := k2.Unwrap(ct2, nil); err != nil {
		t.Fatal(err)
	}
}

func TestRotateWithoutRestart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "kek.json")
	running, err := envelope.LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := running.Wrap([]byte("old"), nil)
	before := running.PrimaryKeyID()
	// No pause for the file's mtime to move: the running server reloads
	// on the new key's unknown id even when the mtime looks unchanged
	// (TestUnwrapReloadsOnUnknownKeyID).
	id, err := envelope.Rotate(path)
	if err != nil {
		t.Fatal(err)
	}
	if id == before {
		t.Fatal("rotation kept the primary key")
	}
	// A CLI process loads the rotated file and wraps with the new key...
	cli, err := envelope.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	fresh, _ := cli.Wrap([]byte("new"), nil)
	// ...and the server that loaded the old file still opens it, and the old.
	if pt, err := running.Unwrap(fresh, nil); err != nil || string(pt) != "new" {
		t.Fatalf("running server could not open material wrapped after rotation: %v", err)
	}
	if pt, err := running.Unwrap(old, nil); err != nil || string(pt) != "old" {
		t.Fatalf("old material: %v", err)
	}
	if running.PrimaryKeyID() != id {
		t.Fatal("running server did not pick up the new primary key")
	}
}

func TestRefusesFileOthersMayRead(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "kek.json")
	if _, err := envelope.LoadOrCreate(path); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o644, 0o604, 0o660, 0o620} {
		os.Chmod(path, mode)
		if _, err := envelope.Load(path); err == nil {
			t.Fatalf("KEK file of mode %v accepted", mode)
		}
	}
	// As Kubernetes mounts a Secret for a non-root Pod (fsGroup).
	os.Chmod(path, 0o440)
	if _, err := envelope.Load(path); err != nil {
		t.Fatalf("KEK file of mode 0440 refused: %v", err)
	}
	os.WriteFile(filepath.Join(filepath.Dir(path), "bad.json"), []byte("{}"), 0o600)
	if _, err := envelope.Load(filepath.Join(filepath.Dir(path), "bad.json")); err == nil {
		t.Fatal("garbage KEK file accepted")
	}
}

// Rotations that run at once (other processes included: each takes the
// file lock through its own descriptor) each keep their key: none rewrites
// the file from a stale read.
func TestConcurrentRotationsKeepEveryKey(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "kek.json")
	if _, err := envelope.LoadOrCreate(path); err != nil {
		t.Fatal(err)
	}
	const n = 12
	ids := make(chan uint32, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := envelope.Rotate(path)
			if err != nil {
				t.Error(err)
				return
			}
			ids <- id
		}()
	}
	wg.Wait()
	close(ids)
	k, err := envelope.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	// Every rotation's key is in the file: material wrapped under it opens.
	for id := range ids {
		if !k.HasKey(id) {
			t.Errorf("key %d of a concurrent rotation was dropped", id)
		}
	}
}

// A server meeting a key id it has not loaded reloads the file even when
// the file's timestamp looks unchanged (a rotation within the file
// system's timestamp granularity, or a restored mtime).
func TestUnwrapReloadsOnUnknownKeyID(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "kek.json")
	server, err := envelope.LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if _, err := envelope.Rotate(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	rotated, err := envelope.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := rotated.Wrap([]byte("new data key"), []byte("vault:x"))
	if err != nil {
		t.Fatal(err)
	}
	if pt, err := server.Unwrap(ct, []byte("vault:x")); err != nil || string(pt) != "new data key" {
		t.Fatalf("unwrap under an unloaded key: %q %v", pt, err)
	}
}
