package federation

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/store"
)

// MaxAccessTokenLifetime is the spec's bound on an issued token's life.
const MaxAccessTokenLifetime = 15 * time.Minute

// accessTokenType is the JWT header typ of access tokens (RFC 9068 §2.1).
const accessTokenType = "at+jwt"

// maxAccessToken bounds what VerifyAccessToken looks at; our tokens are
// well under 1 KB.
const maxAccessToken = 4096

// signingKey is one ES256 key: public always, private when loaded for
// signing.
type signingKey struct {
	id           string
	generation   int64
	header       string // the access token's encoded JOSE header, the same for every token this key signs
	pub          *ecdsa.PublicKey
	priv         *ecdsa.PrivateKey
	signFrom     time.Time
	signUntil    time.Time
	publishUntil time.Time
}

// signer keeps the signing keys in memory. The database is the source of
// truth, shared by replicas: a key one replica creates is found by the
// others when they meet its kid or when their current key runs out.
type signer struct {
	s *Service

	mu         sync.RWMutex
	keys       map[string]*signingKey // every published key by kid
	current    *signingKey
	lastReload time.Time
}

// wrapAD binds a wrapped private key to its row: a wrapped key copied to
// another row does not open.
func wrapAD(kid string) []byte { return []byte("cohort/signing-key/" + kid) }

// reload reads the published keys and unwraps the private part of the one
// that signs now. It also creates the next key when the schedule says so.
func (g *signer) reload(ctx context.Context) error {
	now := g.s.now()
	if err := g.rotate(ctx, now); err != nil {
		return err
	}
	var rows []store.SigningKey
	if err := g.s.DB.NewSelect().Model(&rows).Where("publish_until > ?", now).Order("generation").Scan(ctx); err != nil {
		return err
	}
	keys := make(map[string]*signingKey, len(rows))
	var current *signingKey
	g.mu.RLock()
	old := g.keys
	g.mu.RUnlock()
	for i := range rows {
		r := &rows[i]
		k, err := g.parse(r, old[r.ID])
		if err != nil {
			return err
		}
		keys[k.id] = k
		if !now.Before(k.signFrom) && now.Before(k.signUntil) {
			current = k
		}
	}
	if current != nil && current.priv == nil {
		der, err := base64.StdEncoding.DecodeString(rowOf(rows, current.id).PrivateKeyWrapped)
		if err != nil {
			return fmt.Errorf("signing key %s: %w", current.id, err)
		}
		pt, err := g.s.KEK.Unwrap(der, wrapAD(current.id))
		if err != nil {
			return fmt.Errorf("signing key %s: %w", current.id, err)
		}
		pk, err := x509.ParsePKCS8PrivateKey(pt)
		clear(pt)
		if err != nil {
			return fmt.Errorf("signing key %s: %w", current.id, err)
		}
		priv, ok := pk.(*ecdsa.PrivateKey)
		if !ok {
			return fmt.Errorf("signing key %s is not ECDSA", current.id)
		}
		current.priv = priv
	}
	g.mu.Lock()
	g.keys, g.current, g.lastReload = keys, current, now
	g.mu.Unlock()
	return nil
}

func rowOf(rows []store.SigningKey, id string) *store.SigningKey {
	for i := range rows {
		if rows[i].ID == id {
			return &rows[i]
		}
	}
	return nil
}

// parse turns a row into a key, reusing the already parsed one (and its
// unwrapped private part) when the row is unchanged.
func (g *signer) parse(r *store.SigningKey, prev *signingKey) (*signingKey, error) {
	if prev != nil && prev.signFrom.Equal(r.SignFrom) && prev.signUntil.Equal(r.SignUntil) {
		return prev, nil
	}
	raw, err := base64.StdEncoding.DecodeString(r.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", r.ID, err)
	}
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), raw)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", r.ID, err)
	}
	return &signingKey{id: r.ID, generation: r.Generation, header: accessTokenHeader(r.ID), pub: pub,
		signFrom: r.SignFrom, signUntil: r.SignUntil, publishUntil: r.PublishUntil}, nil
}

// accessTokenHeader is the encoded header of the access tokens key kid
// signs: what golang-jwt writes for jwt.NewWithClaims(jwt.SigningMethodES256,
// …) with typ at+jwt and the kid (a map, so the names are sorted).
func accessTokenHeader(kid string) string {
	h := append([]byte(`{"alg":"ES256"`), `,"kid":`...)
	h = appendJSONString(h, kid)
	h = append(h, `,"typ":"`+accessTokenType+`"}`...)
	return base64.RawURLEncoding.EncodeToString(h)
}

// rotate creates the next key when the newest one is about to stop
// signing (it is then published a pre-publication period before it signs,
// so verifiers that cache our JWKS already hold it), or immediately when
// there is none that signs now. Replicas racing here insert the same
// generation; the unique constraint keeps one.
func (g *signer) rotate(ctx context.Context, now time.Time) error {
	cfg := g.s.settings()
	var newest store.SigningKey
	err := g.s.DB.NewSelect().Model(&newest).Order("generation DESC").Limit(1).Scan(ctx)
	exists := err == nil
	if err != nil && !errors.Is(err, errNoRows) {
		return err
	}
	var gen int64 = 1
	from := now
	switch {
	case !exists:
	case !now.Before(newest.SignUntil):
		// No key signs now (a first start, or the service was down past
		// the end of the newest key): one that signs at once.
		gen = newest.Generation + 1
	case !now.Before(newest.SignUntil.Add(-cfg.KeyPrepublish)):
		gen, from = newest.Generation+1, newest.SignUntil
	default:
		return nil
	}
	return g.create(ctx, gen, from, cfg.KeyRotation)
}

func (g *signer) create(ctx context.Context, gen int64, from time.Time, period time.Duration) error {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	pub, err := priv.PublicKey.Bytes()
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	id := uuid.NewString()
	wrapped, err := g.s.KEK.Wrap(der, wrapAD(id))
	clear(der)
	if err != nil {
		return err
	}
	until := from.Add(period)
	row := &store.SigningKey{
		ID: id, Generation: gen, Algorithm: "ES256",
		PublicKey:         base64.StdEncoding.EncodeToString(pub),
		PrivateKeyWrapped: base64.StdEncoding.EncodeToString(wrapped),
		SignFrom:          from, SignUntil: until,
		// Published until every token it may sign has expired, plus a
		// minute for clock skew between replicas.
		PublishUntil: until.Add(MaxAccessTokenLifetime + time.Minute),
		CreatedAt:    g.s.now(),
	}
	if _, err := g.s.DB.NewInsert().Model(row).Exec(ctx); err != nil && !store.IsUniqueViolation(err) {
		return err
	}
	return nil
}

// signingKeyNow returns the key that signs now, reloading when the cached
// one ran out.
func (g *signer) signingKeyNow(ctx context.Context) (*signingKey, error) {
	now := g.s.now()
	g.mu.RLock()
	cur := g.current
	g.mu.RUnlock()
	if cur != nil && cur.priv != nil && !now.Before(cur.signFrom) && now.Before(cur.signUntil) {
		return cur, nil
	}
	if err := g.reload(ctx); err != nil {
		return nil, err
	}
	g.mu.RLock()
	cur = g.current
	g.mu.RUnlock()
	if cur == nil || cur.priv == nil {
		return nil, errors.New("no signing key")
	}
	return cur, nil
}

// accessClaims are the claims of an issued access token (RFC 9068 plus
// ours), as VerifyAccessToken reads them.
type accessClaims struct {
	jwt.RegisteredClaims
	ClientID           string `json:"client_id"`
	Scope              string `json:"scope"`
	FederationPolicyID string `json:"federation_policy_id"`
	FederationIssuerID string `json:"federation_issuer_id"`
}

// accessGrant is what an issued access token says: its claims are
// appendClaims of it.
type accessGrant struct {
	issuer, subject, id string
	issuedAt, expiresAt int64 // Unix seconds
	clientID            string
	policyID, issuerID  string
}

// appendClaims appends the token's claims set: the bytes json.Marshal
// writes for the equivalent accessClaims (iss, sub, aud as an array, exp,
// iat, jti, then ours), without its reflection.
func (a *accessGrant) appendClaims(dst []byte) []byte {
	dst = append(dst, '{')
	if a.issuer != "" {
		dst = appendJSONMember(dst, "iss", a.issuer)
	}
	if a.subject != "" {
		dst = appendJSONMember(dst, "sub", a.subject)
	}
	dst = appendJSONName(dst, "aud")
	dst = append(dst, '[')
	dst = appendJSONString(dst, a.issuer)
	dst = append(dst, ']')
	dst = appendJSONInt(dst, "exp", a.expiresAt)
	dst = appendJSONInt(dst, "iat", a.issuedAt)
	if a.id != "" {
		dst = appendJSONMember(dst, "jti", a.id)
	}
	dst = appendJSONMember(dst, "client_id", a.clientID)
	dst = appendJSONMember(dst, "scope", scopeInference)
	dst = appendJSONMember(dst, "federation_policy_id", a.policyID)
	dst = appendJSONMember(dst, "federation_issuer_id", a.issuerID)
	return append(dst, '}')
}

// issue signs an access token with the key that signs now. The signature
// is golang-jwt's ES256 signing method, as for any token it builds; only
// the JSON is written here: the header is encoded once per key, the claims
// by appendClaims.
func (g *signer) issue(ctx context.Context, a *accessGrant) (string, error) {
	k, err := g.signingKeyNow(ctx)
	if err != nil {
		return "", err
	}
	var claims, enc [1024]byte // on the stack unless the claims are unusually long
	c := a.appendClaims(claims[:0])
	b64 := base64.RawURLEncoding
	// One allocation for the whole token: the signing input is a prefix
	// of the builder's buffer, which later writes only extend. An ES256
	// signature is 64 bytes.
	var t strings.Builder
	t.Grow(len(k.header) + 1 + b64.EncodedLen(len(c)) + 1 + b64.EncodedLen(64))
	t.WriteString(k.header)
	t.WriteByte('.')
	t.Write(b64.AppendEncode(enc[:0], c))
	sig, err := jwt.SigningMethodES256.Sign(t.String(), k.priv)
	if err != nil {
		return "", err
	}
	t.WriteByte('.')
	t.Write(b64.AppendEncode(enc[:0], sig))
	return t.String(), nil
}

// publicKey returns the published key with kid, reloading from the
// database (at most once a second) when this replica does not know it.
func (g *signer) publicKey(ctx context.Context, kid string) (*ecdsa.PublicKey, error) {
	now := g.s.now()
	g.mu.RLock()
	k, last := g.keys[kid], g.lastReload
	g.mu.RUnlock()
	if k == nil && now.Sub(last) >= time.Second {
		if err := g.reload(ctx); err != nil {
			return nil, err
		}
		g.mu.RLock()
		k = g.keys[kid]
		g.mu.RUnlock()
	}
	if k == nil || !now.Before(k.publishUntil) {
		return nil, errors.New("unknown or retired key")
	}
	return k.pub, nil
}

// published returns the keys to publish now, oldest first.
func (g *signer) published(ctx context.Context) ([]*signingKey, error) {
	now := g.s.now()
	g.mu.RLock()
	stale := g.current == nil || !now.Before(g.current.signUntil) || now.Sub(g.lastReload) >= time.Minute
	g.mu.RUnlock()
	if stale {
		if err := g.reload(ctx); err != nil {
			return nil, err
		}
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	out := make([]*signingKey, 0, len(g.keys))
	for _, k := range g.keys {
		if now.Before(k.publishUntil) {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b *signingKey) int { return int(a.generation - b.generation) })
	return out, nil
}

// VerifyAccessToken implements auth.TokenVerifier: it checks an access
// token's signature, header typ, issuer, audience, expiry and scope, and
// returns the id of the API key it acts as. The caller (the
// authenticator) then loads that key and checks its state, as for the key
// itself. federation_policy_id and federation_issuer_id are not read.
func (s *Service) VerifyAccessToken(ctx context.Context, token string) (string, error) {
	invalid := apierr.Unauthenticated("invalid or expired access token")
	if len(token) > maxAccessToken {
		return "", invalid
	}
	cfg := s.settings()
	var c accessClaims
	p := jwt.NewParser(
		jwt.WithValidMethods([]string{"ES256"}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuer(cfg.TokenIssuer),
		jwt.WithAudience(cfg.TokenIssuer),
		jwt.WithTimeFunc(s.now),
	)
	t, err := p.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		if typ, _ := t.Header["typ"].(string); typ != accessTokenType {
			return nil, errors.New("typ is not at+jwt")
		}
		kid, _ := t.Header["kid"].(string)
		return s.signer.publicKey(ctx, kid)
	})
	if err != nil || !t.Valid {
		return "", invalid.WithCause(err)
	}
	if c.Scope != scopeInference || c.ClientID == "" {
		return "", invalid
	}
	// A token is never valid longer than the maximum lifetime after it
	// was issued, whatever its exp says.
	if c.IssuedAt == nil || c.ExpiresAt.Sub(c.IssuedAt.Time) > MaxAccessTokenLifetime {
		return "", invalid
	}
	return c.ClientID, nil
}
