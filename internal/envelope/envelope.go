// Package envelope is the one component that touches raw key material the
// service itself holds. A key-encryption key (KEK, a Tink AES-256-GCM
// keyset) wraps the service's own keys — vault data keys, signing keys,
// daemon credentials — which are then stored wrapped in the database.
//
// The KEK lives in a file: generated on first start in the data directory
// for the embedded default, or supplied by the operator. Rotate adds a new
// primary key to the file; old wrapped keys still unwrap (Tink tags each
// ciphertext with its key id), and a running server that meets a key id it
// has not loaded re-reads the file, so rotation needs no restart.
package envelope

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tink-crypto/tink-go/v2/aead"
	"github.com/tink-crypto/tink-go/v2/insecurecleartextkeyset"
	"github.com/tink-crypto/tink-go/v2/keyset"
	"github.com/tink-crypto/tink-go/v2/tink"
)

// KEK wraps and unwraps key material.
type KEK struct {
	path string

	mu      sync.RWMutex
	aead    tink.AEAD
	modTime time.Time
	primary uint32
	ids     map[uint32]bool // the key ids loaded
}

// ErrUnwrap is returned when wrapped material does not open: wrong key,
// wrong associated data, or tampering. It carries no detail on purpose.
var ErrUnwrap = errors.New("envelope: wrapped key material does not open")

// LoadOrCreate loads the KEK file at path, creating it (mode 0600) with a
// fresh keyset when it does not exist.
func LoadOrCreate(path string) (*KEK, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		h, err := keyset.NewHandle(aead.AES256GCMKeyTemplate())
		if err != nil {
			return nil, err
		}
		if err := writeKeyset(path, h, true); err != nil {
			return nil, err
		}
	}
	return Load(path)
}

// Load loads an existing KEK file.
func Load(path string) (*KEK, error) {
	k := &KEK{path: path}
	if err := k.reload(); err != nil {
		return nil, err
	}
	return k, nil
}

func readKeyset(path string) (*keyset.Handle, time.Time, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("key-encryption key: %w", err)
	}
	// Group read is allowed: Kubernetes mounts a Secret's files 0440 for
	// a non-root Pod (fsGroup), and only the file's group may read it.
	if st.Mode().Perm()&0o037 != 0 {
		return nil, time.Time{}, fmt.Errorf("key-encryption key %s is readable by others or writable by its group (mode %v): chmod 600 it", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("key-encryption key: %w", err)
	}
	h, err := insecurecleartextkeyset.Read(keyset.NewJSONReader(bytes.NewReader(b)))
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("key-encryption key %s is not a Tink keyset", path)
	}
	return h, st.ModTime(), nil
}

func (k *KEK) reload() error {
	h, mod, err := readKeyset(k.path)
	if err != nil {
		return err
	}
	a, err := aead.New(h)
	if err != nil {
		return fmt.Errorf("key-encryption key %s: %w", k.path, err)
	}
	ids := map[uint32]bool{}
	for _, ki := range h.KeysetInfo().GetKeyInfo() {
		ids[ki.GetKeyId()] = true
	}
	k.mu.Lock()
	k.aead, k.modTime, k.primary, k.ids = a, mod, h.KeysetInfo().GetPrimaryKeyId(), ids
	k.mu.Unlock()
	return nil
}

// writeKeyset writes h to path atomically (temporary file and rename).
func writeKeyset(path string, h *keyset.Handle, exclusive bool) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := insecurecleartextkeyset.Write(h, keyset.NewJSONWriter(&buf)); err != nil {
		return err
	}
	if exclusive {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := f.Write(buf.Bytes()); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".kek-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	// The rename itself must be durable before anything is wrapped under
	// the new key: after a power loss the old file would come back.
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Wrap encrypts key material, bound to ad (who the material belongs to).
func (k *KEK) Wrap(plaintext, ad []byte) ([]byte, error) {
	k.mu.RLock()
	a := k.aead
	k.mu.RUnlock()
	return a.Encrypt(plaintext, ad)
}

// Unwrap decrypts what Wrap produced with the same ad. When that fails
// and the ciphertext names a key id not loaded, or the KEK file changed
// since it was loaded (a rotation, perhaps within the file system's
// timestamp granularity), it reloads once.
func (k *KEK) Unwrap(ciphertext, ad []byte) ([]byte, error) {
	k.mu.RLock()
	a, mod, ids := k.aead, k.modTime, k.ids
	k.mu.RUnlock()
	if pt, err := a.Decrypt(ciphertext, ad); err == nil {
		return pt, nil
	}
	unknown := false
	// Tink's prefix: 0x01, then the key id, big-endian.
	if len(ciphertext) > 5 && ciphertext[0] == 1 {
		unknown = !ids[binary.BigEndian.Uint32(ciphertext[1:5])]
	}
	if st, err := os.Stat(k.path); err == nil && (unknown || !st.ModTime().Equal(mod)) {
		if k.reload() == nil {
			k.mu.RLock()
			a = k.aead
			k.mu.RUnlock()
			if pt, err := a.Decrypt(ciphertext, ad); err == nil {
				return pt, nil
			}
		}
	}
	return nil, ErrUnwrap
}

// AEAD returns the current KEK as a tink.AEAD, for Tink APIs that wrap
// keysets themselves (keyset.Handle.WriteWithAssociatedData).
func (k *KEK) AEAD() tink.AEAD { return kekAEAD{k} }

type kekAEAD struct{ k *KEK }

func (a kekAEAD) Encrypt(pt, ad []byte) ([]byte, error) { return a.k.Wrap(pt, ad) }
func (a kekAEAD) Decrypt(ct, ad []byte) ([]byte, error) { return a.k.Unwrap(ct, ad) }

// HasKey reports whether key id is among the keys loaded.
func (k *KEK) HasKey(id uint32) bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.ids[id]
}

// PrimaryKeyID is the id of the KEK key new wraps use.
func (k *KEK) PrimaryKeyID() uint32 {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.primary
}

// Rotate adds a fresh key to the KEK file at path and makes it primary.
// Old keys stay so existing wrapped material still opens until re-wrapped.
// It returns the new primary key id once the file holding it is durably
// on disk. Concurrent rotations (other processes included) wait for each
// other on an exclusive lock beside the file, so none drops another's key;
// a rotation killed midway leaves the old file or the new one, never a
// mix.
func Rotate(path string) (uint32, error) {
	unlock, err := lockFile(path + ".lock")
	if err != nil {
		return 0, fmt.Errorf("lock the key-encryption key: %w", err)
	}
	defer unlock()
	h, _, err := readKeyset(path)
	if err != nil {
		return 0, err
	}
	m := keyset.NewManagerFromHandle(h)
	id, err := m.Add(aead.AES256GCMKeyTemplate())
	if err != nil {
		return 0, err
	}
	if err := m.SetPrimary(id); err != nil {
		return 0, err
	}
	nh, err := m.Handle()
	if err != nil {
		return 0, err
	}
	if err := writeKeyset(path, nh, false); err != nil {
		return 0, err
	}
	return id, nil
}
