// Package keys makes and recognises API keys. A key is 32 random bytes
// (256 bits) in base64url behind a readable kind prefix; only its SHA-256 is
// stored. A plain hash suffices because the key is uniformly random: there is
// nothing to guess that a slow hash would protect.
package keys

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
)

var prefixes = map[string]string{
	"management": "cohort_mk_",
	"workspace":  "cohort_wk_",
	"personal":   "cohort_pk_",
}

// bodyLen is the length of the base64url body of 32 bytes.
const bodyLen = 43

// New returns a fresh key of the given kind and its hash.
func New(kind string) (key, hash string, err error) {
	p, ok := prefixes[kind]
	if !ok {
		return "", "", fmt.Errorf("unknown key kind %q", kind)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	key = p + base64.RawURLEncoding.EncodeToString(b[:])
	return key, Hash(key), nil
}

// Hash is the stored form of a key.
func Hash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Equal compares two stored hashes in constant time.
func Equal(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// WellFormed reports whether s has the shape of a Cohort key, so that
// anything else is refused without touching the database.
func WellFormed(s string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			body := s[len(p):]
			if len(body) != bodyLen {
				return false
			}
			_, err := base64.RawURLEncoding.DecodeString(body)
			return err == nil
		}
	}
	return false
}

// Display is the part of a key safe to show in lists: its prefix and the
// first four characters of its body.
func Display(key string) string {
	for _, p := range prefixes {
		if strings.HasPrefix(key, p) && len(key) >= len(p)+4 {
			return key[:len(p)+4]
		}
	}
	return ""
}
