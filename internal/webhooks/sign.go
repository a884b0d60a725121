package webhooks

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
)

// The Standard Webhooks signature scheme (https://www.standardwebhooks.com):
// a symmetric secret "whsec_" + base64(key bytes); each attempt carries
// webhook-id, webhook-timestamp (Unix seconds of the attempt) and
// webhook-signature, space-separated "v1,"+base64(HMAC-SHA256(key,
// id.timestamp.body)) entries, one per secret in use.

// Header names.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts every signing secret.
const SecretPrefix = "whsec_"

// secretBytes is the size of a new key: the spec asks for 24 to 64 bytes.
const secretBytes = 32

// NewSecret returns a fresh signing secret in its shown form.
func NewSecret() (string, error) {
	b := make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(b), nil
}

// SecretKey returns the key bytes of a secret ("whsec_" optional).
func SecretKey(secret string) ([]byte, error) {
	k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
	if err != nil || len(k) == 0 {
		return nil, errors.New("webhooks: a secret is whsec_ followed by base64")
	}
	return k, nil
}

// Sign returns the v1 signature of one attempt.
func Sign(key []byte, id string, ts time.Time, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(strconv.FormatInt(ts.Unix(), 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// Signatures is the webhook-signature value for keys (the current one,
// then a previous one during a rotation's grace period).
func Signatures(keys [][]byte, id string, ts time.Time, body []byte) string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = Sign(k, id, ts, body)
	}
	return strings.Join(out, " ")
}
