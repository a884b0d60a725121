package e2e_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// boundTarget is an HTTPS host that a vault secret is bound to, on
// loopback under a .localhost name (the gateway's jails reach it only
// because the test lists 127.0.0.1/32 with --intern-egress-allow-hosts),
// with a certificate of its own CA, which the gateway's
// --http-tool-ca-file makes the interns trust. It records the
// Authorization header of each request.
type boundTarget struct {
	srv    *httptest.Server
	Host   string // target.localhost:PORT
	CAFile string
	mu     sync.Mutex
	auth   []string
}

func startBoundTarget(t *testing.T) *boundTarget {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "target.localhost"},
		DNSNames: []string{"target.localhost"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	b := &boundTarget{CAFile: filepath.Join(t.TempDir(), "ca.pem")}
	if err := os.WriteFile(b.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.mu.Lock()
		b.auth = append(b.auth, r.Header.Get("Authorization"))
		b.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("target answered " + r.URL.Path))
	}))
	b.srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	b.srv.StartTLS()
	t.Cleanup(b.srv.Close)
	b.Host = "target.localhost:" + strconv.Itoa(b.srv.Listener.Addr().(*net.TCPAddr).Port)
	return b
}

func (b *boundTarget) Auth() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.auth...)
}
