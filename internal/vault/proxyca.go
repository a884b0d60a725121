package vault

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"

	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/store"
)

// The proxy CA lets the egress proxy stand in for a host that a secret is
// bound to (ADR 0931). One per gateway installation (every replica
// shares the database row); its key is wrapped by the KEK and exists
// unwrapped only in the gateway's memory. Jails receive its certificate.
const (
	proxyCAID = "current"
	// proxyCALife is the CA's validity; a gateway that starts within
	// proxyCARenew of its end makes a new one.
	proxyCALife  = 5 * 365 * 24 * time.Hour
	proxyCARenew = 30 * 24 * time.Hour
	// LeafLife is a leaf certificate's validity; leaves are cached until
	// leafRenew before their end.
	LeafLife  = time.Hour
	leafRenew = 10 * time.Minute
)

// ProxyCA signs the egress proxy's leaf certificates.
type ProxyCA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM string
	// leafKey is the one key of every leaf: a leaf is then one signature,
	// and the key, like the CA's, never leaves the gateway.
	leafKey *ecdsa.PrivateKey
	now     func() time.Time

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

func proxyCAAD(id string) []byte { return []byte("cohort/proxy-ca/" + id) }

// LoadProxyCA reads the gateway's proxy CA, making it on first use (or
// near its end): replicas that race insert one row, and all use it.
func LoadProxyCA(ctx context.Context, db bun.IDB, kek *envelope.KEK, now func() time.Time) (*ProxyCA, error) {
	if now == nil {
		now = time.Now
	}
	for attempt := 0; attempt < 2; attempt++ {
		var row store.ProxyCA
		err := db.NewSelect().Model(&row).Where("id = ?", proxyCAID).Scan(ctx)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if err := createProxyCA(ctx, db, kek, now(), false); err != nil {
				return nil, err
			}
			continue
		case err != nil:
			return nil, fmt.Errorf("proxy CA: %w", err)
		}
		if row.NotAfter.Before(now().Add(proxyCARenew)) && attempt == 0 {
			if err := createProxyCA(ctx, db, kek, now(), true); err != nil {
				return nil, err
			}
			continue
		}
		return openProxyCA(&row, kek, now)
	}
	return nil, errors.New("proxy CA: no usable row after creating one")
}

// newCA makes a CA key and its self-signed certificate.
func newCA(now time.Time, name string, life time.Duration) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	tmpl := &x509.Certificate{SerialNumber: serial,
		Subject:   pkix.Name{CommonName: name, Organization: []string{"Cohort"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(life),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return key, cert, err
}

// NewEphemeralProxyCA is a proxy CA that lives in this process's memory
// only, never stored: a remote `cohort intern --jail`'s, whose process
// holds neither the database nor the gateway's CA key (ADR 0932), trusted
// by that one jail.
func NewEphemeralProxyCA() (*ProxyCA, error) {
	key, cert, err := newCA(time.Now(), "Cohort remote jail proxy CA", proxyCALife)
	if err != nil {
		return nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &ProxyCA{cert: cert, key: key, certPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})),
		leafKey: leafKey, now: time.Now, leaves: map[string]*tls.Certificate{}}, nil
}

func createProxyCA(ctx context.Context, db bun.IDB, kek *envelope.KEK, now time.Time, replace bool) error {
	key, tmpl, err := newCA(now, "Cohort egress proxy CA", proxyCALife)
	if err != nil {
		return err
	}
	der := tmpl.Raw
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	wrapped, err := kek.Wrap(pk, proxyCAAD(proxyCAID))
	clear(pk)
	if err != nil {
		return fmt.Errorf("proxy CA: wrap: %w", err)
	}
	row := &store.ProxyCA{ID: proxyCAID, CertPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		WrappedKey: wrapped, NotAfter: tmpl.NotAfter, CreatedAt: now}
	q := db.NewInsert().Model(row)
	if replace {
		q = q.On("CONFLICT (id) DO UPDATE").Set("cert_pem = EXCLUDED.cert_pem, wrapped_key = EXCLUDED.wrapped_key, not_after = EXCLUDED.not_after, created_at = EXCLUDED.created_at")
	} else {
		q = q.On("CONFLICT (id) DO NOTHING")
	}
	if _, err := q.Exec(ctx); err != nil {
		return fmt.Errorf("proxy CA: store: %w", err)
	}
	return nil
}

func openProxyCA(row *store.ProxyCA, kek *envelope.KEK, now func() time.Time) (*ProxyCA, error) {
	b, _ := pem.Decode([]byte(row.CertPEM))
	if b == nil {
		return nil, errors.New("proxy CA: the stored certificate does not parse")
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("proxy CA: %w", err)
	}
	pk, err := kek.Unwrap(row.WrappedKey, proxyCAAD(row.ID))
	if err != nil {
		return nil, fmt.Errorf("proxy CA: unwrap its key (another KEK?): %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(pk)
	clear(pk)
	if err != nil {
		return nil, fmt.Errorf("proxy CA: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("proxy CA: the stored key cannot sign")
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &ProxyCA{cert: cert, key: signer, certPEM: row.CertPEM, leafKey: leafKey, now: now, leaves: map[string]*tls.Certificate{}}, nil
}

// RewrapProxyCA re-wraps the proxy CA's key under the KEK's current
// primary key (a KEK rotation, with RewrapAll); no CA yet is no error.
func RewrapProxyCA(ctx context.Context, db bun.IDB, kek *envelope.KEK) error {
	var row store.ProxyCA
	err := db.NewSelect().Model(&row).Where("id = ?", proxyCAID).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("proxy CA: %w", err)
	}
	pk, err := kek.Unwrap(row.WrappedKey, proxyCAAD(row.ID))
	if err != nil {
		return fmt.Errorf("proxy CA: unwrap: %w", err)
	}
	wrapped, err := kek.Wrap(pk, proxyCAAD(row.ID))
	clear(pk)
	if err != nil {
		return fmt.Errorf("proxy CA: wrap: %w", err)
	}
	_, err = db.NewUpdate().Model((*store.ProxyCA)(nil)).Set("wrapped_key = ?", wrapped).Where("id = ?", row.ID).Exec(ctx)
	return err
}

// CertPEM is the CA's certificate, what jails trust.
func (ca *ProxyCA) CertPEM() string { return ca.certPEM }

// Certificate is a leaf for host (a normalized DNS name), valid for
// LeafLife, cached until shortly before its end.
func (ca *ProxyCA) Certificate(host string) (*tls.Certificate, error) {
	now := ca.now()
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c := ca.leaves[host]; c != nil && now.Add(leafRenew).Before(c.Leaf.NotAfter) {
		return c, nil
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(LeafLife),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	// A bound on the cache: hosts with bound secrets are few; past this
	// it starts again.
	if len(ca.leaves) >= 4096 {
		clear(ca.leaves)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: leaf}
	ca.leaves[host] = c
	return c, nil
}

// Bound says whether intern internID (live, its organization in the
// programme) has a secret bound to host in its vault or its workspace's:
// the egress proxy intercepts only such hosts.
func (s *Service) Bound(ctx context.Context, internID, host string) (bool, error) {
	host, err := NormalizeHost(host)
	if err != nil {
		return false, nil
	}
	in, err := s.loadIntern(ctx, internID)
	if err != nil || in == nil || !in.Programme {
		return false, err
	}
	var rows []store.VaultSecret
	err = s.DB.NewSelect().Model(&rows).Column("hosts").
		Join("JOIN vaults AS v ON v.id = ?TableAlias.vault_id").
		Where("((v.scope_kind = ? AND v.owner_id = ?) OR (v.scope_kind = ? AND v.owner_id = ?))",
			store.VaultScopeIntern, in.ID, store.VaultScopeWorkspace, in.WorkspaceID).
		Where("?TableAlias.hosts IS NOT NULL").
		Scan(ctx)
	if err != nil {
		return false, err
	}
	for _, r := range rows {
		var hosts []string
		if json.Unmarshal([]byte(*r.Hosts), &hosts) == nil && slices.Contains(hosts, host) {
			return true, nil
		}
	}
	return false, nil
}

// ProxyDoor is the vault as the egress proxy asks it (egress.Secrets):
// the same release, rule and audit as the http_request tool's.
type ProxyDoor struct {
	S  *Service
	CA *ProxyCA
}

// ProxyActor is the audit's actor of the egress proxy's releases.
const ProxyActor = "egress-proxy"

func (d ProxyDoor) Bound(ctx context.Context, intern, host string) (bool, error) {
	return d.S.Bound(ctx, intern, host)
}

func (d ProxyDoor) Release(ctx context.Context, intern, name, host string) (string, error) {
	return d.S.Release(ctx, ReleaseRequest{InternID: intern, Name: name, Host: host, Actor: ProxyActor})
}

func (d ProxyDoor) Certificate(host string) (*tls.Certificate, error) { return d.CA.Certificate(host) }

// RemoteProxyDoor is the vault as a remote `cohort intern --jail`'s proxy
// asks it (egress.Secrets): through the gateway's InternGatewayService with
// the daemon's credential, so the release is the gateway's (one rule,
// audited as the daemon's), and with the process's own ephemeral CA.
type RemoteProxyDoor struct {
	Gateway  cohortv1connect.InternGatewayServiceClient
	InternID string
	CA       *ProxyCA
}

func (d RemoteProxyDoor) Bound(ctx context.Context, _, host string) (bool, error) {
	res, err := d.Gateway.HostBound(ctx, connect.NewRequest(&cohortv1.HostBoundRequest{InternId: d.InternID, Host: host}))
	if err != nil {
		return false, err
	}
	return res.Msg.GetBound(), nil
}

func (d RemoteProxyDoor) Release(ctx context.Context, _, name, host string) (string, error) {
	res, err := d.Gateway.ReleaseSecret(ctx, connect.NewRequest(&cohortv1.ReleaseSecretRequest{InternId: d.InternID, Name: name, Host: host}))
	if err != nil {
		return "", err
	}
	return res.Msg.GetValue(), nil
}

func (d RemoteProxyDoor) Certificate(host string) (*tls.Certificate, error) {
	return d.CA.Certificate(host)
}
