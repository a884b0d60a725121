package vault

import (
	"net/http"
	"strings"
	"time"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/httpx"
)

// REST is the REST door: PUT /api/v1/vault/interns/{internId}/secrets/{name},
// and every other path under /api/v1/vault/ (so that callers outside the
// programme get the same plain 404 there too). Errors are
// {"error":{"code","message","metadata":{"reason"}}}; the 401 and the
// programme 404 carry no metadata.
type REST struct {
	S    *Service
	Auth *auth.Authenticator
}

// putBody is the request body. Unknown fields are refused.
type putBody struct {
	Hosts []string `json:"hosts"`
	Value *string  `json:"value"`
}

// SecretJSON is the spec's secret metadata object; hosts and fingerprint
// are null only on legacy rows.
type SecretJSON struct {
	Name        string   `json:"name"`
	Hosts       []string `json:"hosts"`
	Fingerprint *string  `json:"fingerprint"`
	CreatedAt   string   `json:"created_at"`
}

// ToJSON renders metadata as the spec's object.
func ToJSON(m *cohortv1.SecretMetadata) SecretJSON {
	out := SecretJSON{Name: m.GetName(), Fingerprint: m.Fingerprint,
		CreatedAt: m.GetCreatedAt().AsTime().UTC().Format(time.RFC3339Nano)}
	if len(m.GetHosts()) > 0 {
		out.Hosts = m.GetHosts()
	}
	return out
}

// admit authenticates and applies the gates before any body is read.
func (h REST) admit(w http.ResponseWriter, r *http.Request, write bool) *auth.Principal {
	p, err := h.Auth.Bearer(r.Context(), r.Header.Get("Authorization"))
	if err == nil {
		err = h.S.Admit(p, r.Host, write)
	}
	if err != nil {
		httpx.WriteError(w, r, err, true)
		return nil
	}
	return p
}

// Put handles PUT /api/v1/vault/interns/{internId}/secrets/{name}: 201 with
// the metadata when the secret is new, 200 when it replaced one.
func (h REST) Put(w http.ResponseWriter, r *http.Request) {
	p := h.admit(w, r, true)
	if p == nil {
		return
	}
	body, err := httpx.ReadBody(w, r, MaxBody, "payload_too_large")
	if err != nil {
		httpx.WriteError(w, r, err, true)
		return
	}
	var b putBody
	if err := httpx.DecodeStrict(body, &b); err != nil {
		httpx.WriteError(w, r, err, true)
		return
	}
	req := &cohortv1.PutInternSecretRequest{InternId: r.PathValue("internId"), Name: r.PathValue("name"), Hosts: b.Hosts}
	if b.Value != nil {
		req.Value = *b.Value
	}
	res, err := h.S.Put(r.Context(), p, r.Host, req)
	if err != nil {
		httpx.WriteError(w, r, err, true)
		return
	}
	status := http.StatusOK
	if res.GetCreated() {
		status = http.StatusCreated
	}
	httpx.WriteJSON(w, status, ToJSON(res.GetSecret()))
}

// Other answers every other request under /api/v1/vault/: after the same
// gates, 405 on a secret's path with another method than PUT, else 404.
func (h REST) Other(w http.ResponseWriter, r *http.Request) {
	if h.admit(w, r, false) == nil {
		return
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	// api v1 vault interns {id} secrets {name}
	if len(parts) == 7 && parts[3] == "interns" && parts[5] == "secrets" && parts[4] != "" && parts[6] != "" {
		w.Header().Set("Allow", http.MethodPut)
		httpx.WriteError(w, r, apierr.New(http.StatusMethodNotAllowed, "method_not_allowed",
			"%s is not supported on a secret: secrets are written with PUT and never read back", r.Method), true)
		return
	}
	httpx.WriteError(w, r, apierr.New(http.StatusNotFound, "not_found", "no vault route for %s %s", r.Method, r.URL.Path), true)
}
