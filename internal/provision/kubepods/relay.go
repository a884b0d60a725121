package kubepods

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"

	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/store"
)

// Intern Pods have no jail relays: their model endpoint is the gateway's
// own listener, at RelayPath/<intern>/<token>/…, where the gateway puts the
// real key in place of the placeholder, as a jail's model relay does. The
// token is derived from the daemon secret and reaches the Pod only in its
// Secret; the agent holds it in its base URL, which lets it call its own
// model endpoint and nothing else (not the daemon's API: that needs the
// daemon secret, which the agent never sees).

// RelayPath is where the gateway serves intern Pods' model relay.
const RelayPath = "/intern-relay/"

// ModelRelay is the gateway's model relay (*egress.Relay).
type ModelRelay interface {
	// Model relays to baseURL with key's value for the placeholder, or
	// ("") to the operator's endpoint with its key.
	Model(baseURL string, key func(context.Context) (string, error)) (http.Handler, error)
	// ModelPath is the operator's endpoint's path.
	ModelPath() string
	// Hold counts one request of intern's against its cap on open relay
	// connections (egress.DefaultMaxConnsPerIntern): release when done;
	// false past the cap.
	Hold(intern string) (release func(), ok bool)
}

// relayToken is an intern's model relay credential, from its daemon secret.
func relayToken(secret, internID string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("cohort/model-relay/" + internID))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// PodModelRelay serves RelayPath for intern Pods. Anything that is not an
// awake Pod intern's path with its current token is 404, the same whether
// the intern exists or not.
// The row and its secret come from the reconciler (p), which reads the
// database.
func (b *Backend) PodModelRelay(p *provision.Provisioner, r ModelRelay) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(RelayPath+"{id}/{token}/{rest...}", func(w http.ResponseWriter, req *http.Request) {
		id := req.PathValue("id")
		in, secret, err := p.Secret(req.Context(), id)
		if err != nil || in.Provisioner != Name ||
			(in.State != store.InternRunning && in.State != store.InternProvisioning) {
			http.NotFound(w, req)
			return
		}
		if subtle.ConstantTimeCompare([]byte(req.PathValue("token")), []byte(relayToken(secret, id))) != 1 {
			http.NotFound(w, req)
			return
		}
		// Each request holds a listener connection and an upstream one:
		// one intern's are capped as a jail's relay connections are, the
		// excess refused at once, so its neighbours keep theirs.
		release, ok := r.Hold(id)
		if !ok {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many open model requests for this intern", http.StatusServiceUnavailable)
			return
		}
		defer release()
		run, err := b.Agents.For(in.Agent, true)
		if err != nil {
			http.NotFound(w, req)
			return
		}
		base, key := "", func(context.Context) (string, error) { return "", nil }
		if run.Upstream != "" {
			base, key = run.Upstream, b.Agents.ModelKeyFor(id, run)
		}
		h, err := r.Model(base, key)
		if err != nil {
			http.Error(w, "the intern's model endpoint is not valid", http.StatusBadGateway)
			return
		}
		// The rest of the path is the endpoint's own (the base URL keeps it).
		out := req.Clone(req.Context())
		out.URL = &url.URL{Path: "/" + strings.TrimPrefix(req.PathValue("rest"), "/"), RawQuery: req.URL.RawQuery}
		h.ServeHTTP(w, out)
	})
	return mux
}
