package vault

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/rest"
)

// REST is the REST door: PUT /api/v1/vault/interns/{internId}/secrets/{name},
// and every other path under /api/v1/vault/ (so that callers outside the
// programme get the same plain 404 there too). Errors are
// {"error":{"code","message","metadata":{"reason"}}}; the 401 and the
// programme 404 carry no metadata. Each route's caller was authenticated
// and admitted (Service.Admit) where it is declared (internal/server),
// before any body is read.
type REST struct {
	S *Service
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

// readPut reads and strictly decodes a PUT body, answering the error itself.
func readPut(w http.ResponseWriter, r *http.Request) (*putBody, bool) {
	body, err := rest.ReadBody(w, r, MaxBody, apierr.ReasonPayloadTooLarge)
	if err != nil {
		rest.WriteError(w, r, err, true)
		return nil, false
	}
	var b putBody
	if err := rest.DecodeStrict(body, &b); err != nil {
		rest.WriteError(w, r, err, true)
		return nil, false
	}
	return &b, true
}

// Put handles PUT /api/v1/vault/interns/{internId}/secrets/{name}: 201 with
// the metadata when the secret is new, 200 when it replaced one.
func (h REST) Put(w http.ResponseWriter, r *http.Request) {
	p := auth.From(r.Context())
	b, ok := readPut(w, r)
	if !ok {
		return
	}
	req := &cohortv1.PutInternSecretRequest{InternId: r.PathValue("internId"), Name: r.PathValue("name"), Hosts: b.Hosts}
	if b.Value != nil {
		req.Value = *b.Value
	}
	res, err := h.S.Put(r.Context(), p, req)
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	status := http.StatusOK
	if res.GetCreated() {
		status = http.StatusCreated
	}
	rest.WriteJSON(w, status, ToJSON(res.GetSecret()))
}

// PutWorkspace handles PUT /api/v1/vault/secrets/{name}: 201 when new,
// 200 when it replaced a secret of the key's workspace.
func (h REST) PutWorkspace(w http.ResponseWriter, r *http.Request) {
	p := auth.From(r.Context())
	b, ok := readPut(w, r)
	if !ok {
		return
	}
	req := &cohortv1.PutWorkspaceSecretRequest{Name: r.PathValue("name"), Hosts: b.Hosts}
	if b.Value != nil {
		req.Value = *b.Value
	}
	res, err := h.S.PutWorkspace(r.Context(), p, req)
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	status := http.StatusOK
	if res.GetCreated() {
		status = http.StatusCreated
	}
	rest.WriteJSON(w, status, ToJSON(res.GetSecret()))
}

// ListJSON is a page of secret metadata.
type ListJSON struct {
	Data    []SecretJSON `json:"data"`
	HasMore bool         `json:"has_more"`
}

func listJSON(ms []*cohortv1.SecretMetadata, more bool) ListJSON {
	out := ListJSON{Data: make([]SecretJSON, len(ms)), HasMore: more}
	for i, m := range ms {
		out.Data[i] = ToJSON(m)
	}
	return out
}

// pageQuery reads ?limit= and ?after=; unknown parameters are refused.
func pageQuery(r *http.Request) (int32, string, error) {
	q := r.URL.Query()
	for k := range q {
		if k != "limit" && k != "after" {
			return 0, "", apierr.BadRequest("unknown query parameter %q: use limit and after", k)
		}
	}
	var limit int32
	if v := q.Get("limit"); v != "" || q.Has("limit") {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 || n > MaxListLimit {
			return 0, "", apierr.BadRequest("limit must be an integer from 1 to %d", MaxListLimit)
		}
		limit = int32(n)
	}
	return limit, q.Get("after"), nil
}

// ListIntern handles GET /api/v1/vault/interns/{internId}/secrets.
func (h REST) ListIntern(w http.ResponseWriter, r *http.Request) {
	p := auth.From(r.Context())
	limit, after, err := pageQuery(r)
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	res, err := h.S.ListIntern(r.Context(), p, &cohortv1.ListInternSecretsRequest{InternId: r.PathValue("internId"), Limit: limit, After: after})
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	rest.WriteJSON(w, http.StatusOK, listJSON(res.GetSecrets(), res.GetHasMore()))
}

// ListWorkspace handles GET /api/v1/vault/secrets.
func (h REST) ListWorkspace(w http.ResponseWriter, r *http.Request) {
	p := auth.From(r.Context())
	limit, after, err := pageQuery(r)
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	res, err := h.S.ListWorkspace(r.Context(), p, &cohortv1.ListWorkspaceSecretsRequest{Limit: limit, After: after})
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	rest.WriteJSON(w, http.StatusOK, listJSON(res.GetSecrets(), res.GetHasMore()))
}

// DeleteIntern handles DELETE /api/v1/vault/interns/{internId}/secrets/{name}: 204.
func (h REST) DeleteIntern(w http.ResponseWriter, r *http.Request) {
	p := auth.From(r.Context())
	_, err := h.S.DeleteIntern(r.Context(), p, &cohortv1.DeleteInternSecretRequest{InternId: r.PathValue("internId"), Name: r.PathValue("name")})
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// DeleteWorkspace handles DELETE /api/v1/vault/secrets/{name}: 204.
func (h REST) DeleteWorkspace(w http.ResponseWriter, r *http.Request) {
	p := auth.From(r.Context())
	_, err := h.S.DeleteWorkspace(r.Context(), p, &cohortv1.DeleteWorkspaceSecretRequest{Name: r.PathValue("name")})
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Other answers every other request under /api/v1/vault/: after the same
// gates (declared as a read), 405 on a known path with a method it does not take, else 404.
func (h REST) Other(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	allow := ""
	switch {
	// api v1 vault interns {id} secrets {name}
	case len(parts) == 7 && parts[3] == "interns" && parts[5] == "secrets" && parts[4] != "" && parts[6] != "":
		allow = "PUT, DELETE"
	case len(parts) == 6 && parts[3] == "interns" && parts[5] == "secrets" && parts[4] != "":
		allow = "GET"
	case len(parts) == 5 && parts[3] == "secrets" && parts[4] != "":
		allow = "PUT, DELETE"
	case len(parts) == 4 && parts[3] == "secrets":
		allow = "GET"
	}
	if allow != "" {
		w.Header().Set("Allow", allow)
		rest.WriteError(w, r, apierr.New(http.StatusMethodNotAllowed, apierr.ReasonMethodNotAllowed,
			"%s is not supported here (allowed: %s): secret values are never read back", r.Method, allow), true)
		return
	}
	rest.WriteError(w, r, apierr.New(http.StatusNotFound, apierr.ReasonNotFound, "no vault route for %s %s", r.Method, r.URL.Path), true)
}
