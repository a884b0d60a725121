package vault

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tink-crypto/tink-go/v2/aead"
	"github.com/tink-crypto/tink-go/v2/keyset"
	"github.com/tink-crypto/tink-go/v2/mac"
	"github.com/tink-crypto/tink-go/v2/mac/hmac"
	"github.com/tink-crypto/tink-go/v2/tink"

	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/store"
)

// FingerprintPrefix starts every fingerprint.
const FingerprintPrefix = "sha256:"

// errSealed is what a value that does not open becomes: wrong vault, wrong
// name, wrong hosts, a swapped keyset or tampering. It says nothing more.
var errSealed = errors.New("vault: secret does not open")

// Keyring is one vault's unwrapped keys: an AES-256-GCM data key for the
// values and a dedicated HMAC-SHA-256 key for the fingerprints. Both are
// Tink keysets, stored in the vault row wrapped by the key-encryption key
// with the vault's identity as associated data, so a keyset copied onto
// another vault does not open.
type Keyring struct {
	aead tink.AEAD
	mac  tink.MAC
}

// Associated data: parts separated by NUL, which none of them can contain
// (ids are UUIDs, names and hosts are validated ASCII, hosts go in as JSON).
func keysetAD(purpose string, v *store.Vault) []byte {
	return []byte("cohort/vault/v1/" + purpose + "\x00" + v.ScopeKind + "\x00" + v.OwnerID + "\x00" + v.ID)
}

func secretAD(vaultID, name string, hostsJSON string) []byte {
	return []byte("cohort/vault/v1/secret\x00" + vaultID + "\x00" + name + "\x00" + hostsJSON)
}

// fingerprintParams: a plain HMAC-SHA-256 with a 32-byte key and full tag,
// no Tink output prefix, so the tag is exactly the HMAC.
func fingerprintParams() (*hmac.Parameters, error) {
	return hmac.NewParameters(hmac.ParametersOpts{KeySizeInBytes: 32, TagSizeInBytes: 32,
		HashType: hmac.SHA256, Variant: hmac.VariantNoPrefix})
}

// NewKeyring makes fresh keys for the vault v (its ID, ScopeKind and OwnerID
// set) and fills v.DataKeyset and v.MACKeyset with them, wrapped by kek.
func NewKeyring(kek *envelope.KEK, v *store.Vault) (*Keyring, error) {
	dh, err := keyset.NewHandle(aead.AES256GCMKeyTemplate())
	if err != nil {
		return nil, err
	}
	params, err := fingerprintParams()
	if err != nil {
		return nil, err
	}
	m := keyset.NewManager()
	id, err := m.AddNewKeyFromParameters(params)
	if err != nil {
		return nil, err
	}
	if err := m.SetPrimary(id); err != nil {
		return nil, err
	}
	mh, err := m.Handle()
	if err != nil {
		return nil, err
	}
	if v.DataKeyset, err = wrap(kek, dh, keysetAD("data", v)); err != nil {
		return nil, err
	}
	if v.MACKeyset, err = wrap(kek, mh, keysetAD("mac", v)); err != nil {
		return nil, err
	}
	return keyringFrom(dh, mh)
}

func keyringFrom(dh, mh *keyset.Handle) (*Keyring, error) {
	a, err := aead.New(dh)
	if err != nil {
		return nil, err
	}
	m, err := mac.New(mh)
	if err != nil {
		return nil, err
	}
	return &Keyring{aead: a, mac: m}, nil
}

func wrap(kek *envelope.KEK, h *keyset.Handle, ad []byte) ([]byte, error) {
	var buf bytes.Buffer
	if err := h.WriteWithAssociatedData(keyset.NewBinaryWriter(&buf), kek.AEAD(), ad); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func unwrap(kek *envelope.KEK, b, ad []byte) (*keyset.Handle, error) {
	return keyset.ReadWithAssociatedData(keyset.NewBinaryReader(bytes.NewReader(b)), kek.AEAD(), ad)
}

// OpenKeyring unwraps the keys of the vault v. It fails when the KEK does
// not open them or they were wrapped for another vault.
func OpenKeyring(kek *envelope.KEK, v *store.Vault) (*Keyring, error) {
	dh, err := unwrap(kek, v.DataKeyset, keysetAD("data", v))
	if err != nil {
		return nil, fmt.Errorf("vault %s: data keyset does not open: %w", v.ID, err)
	}
	mh, err := unwrap(kek, v.MACKeyset, keysetAD("mac", v))
	if err != nil {
		return nil, fmt.Errorf("vault %s: fingerprint keyset does not open: %w", v.ID, err)
	}
	return keyringFrom(dh, mh)
}

// Rewrap re-wraps v's keysets under kek's current primary key, in place.
// The keys themselves, and so every ciphertext and fingerprint, stay as
// they are.
func Rewrap(kek *envelope.KEK, v *store.Vault) error {
	for _, p := range []struct {
		purpose string
		b       *[]byte
	}{{"data", &v.DataKeyset}, {"mac", &v.MACKeyset}} {
		ad := keysetAD(p.purpose, v)
		h, err := unwrap(kek, *p.b, ad)
		if err != nil {
			return fmt.Errorf("vault %s: %s keyset does not open: %w", v.ID, p.purpose, err)
		}
		if *p.b, err = wrap(kek, h, ad); err != nil {
			return err
		}
	}
	return nil
}

// hostsJSON is the canonical stored form of a host list.
func hostsJSON(hosts []string) string {
	b, _ := json.Marshal(hosts)
	return string(b)
}

// Seal encrypts value for the secret name, bound to hosts, in vault vaultID.
// Values are bytes here so a write converts its value once for both Seal
// and Fingerprint (values reach 64 KiB).
func (k *Keyring) Seal(vaultID, name string, hosts []string, value []byte) ([]byte, error) {
	return k.aead.Encrypt(value, secretAD(vaultID, name, hostsJSON(hosts)))
}

// Open decrypts what Seal produced. Any change to the ciphertext, the vault,
// the name or the hosts makes it fail.
func (k *Keyring) Open(vaultID, name string, hosts []string, ciphertext []byte) (string, error) {
	pt, err := k.aead.Decrypt(ciphertext, secretAD(vaultID, name, hostsJSON(hosts)))
	if err != nil {
		return "", errSealed
	}
	return string(pt), nil
}

// Fingerprint is the HMAC-SHA-256 of value under this vault's fingerprint
// key, as "sha256:" and 64 hex digits. Equal values in one vault give equal
// fingerprints; another vault's key gives another one.
func (k *Keyring) Fingerprint(value []byte) (string, error) {
	tag, err := k.mac.ComputeMAC(value)
	if err != nil {
		return "", err
	}
	return FingerprintPrefix + hex.EncodeToString(tag), nil
}
