package launch

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
)

// The daemon secret is never sent as it is: each direction presents its
// own credential, derived from it with HMAC-SHA256 and a label of its own.
// What the gateway presents to a daemon is useless when replayed to the
// gateway (a program that captured it, say by accepting on a descriptor it
// should never have had, cannot have the vault release a secret), and what
// the daemon presents to the gateway opens no daemon. Neither yields the
// secret, nor the other credential.
const (
	labelGatewayToDaemon = "cohort/daemon-secret/gateway-to-daemon/v1"
	labelDaemonToGateway = "cohort/daemon-secret/daemon-to-gateway/v1"
)

// GatewayCredential is what the gateway (or an operator's client) presents
// to an intern's daemon as its bearer token.
func GatewayCredential(secret string) string { return derive(secret, labelGatewayToDaemon) }

// DaemonCredential is what an intern's daemon presents to the gateway's
// InternGatewayService as its bearer token.
func DaemonCredential(secret string) string { return derive(secret, labelDaemonToGateway) }

func derive(secret, label string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(label))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}
