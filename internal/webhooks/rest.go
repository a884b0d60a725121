package webhooks

import (
	"context"
	"net/http"
	"strconv"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/rest"
)

// REST is the REST door onto Service, under /api/v1/webhooks/. Bodies and
// answers are the Connect messages' JSON (snake_case field names, every
// field present); errors are {"error":{"code","message","metadata":
// {"reason"}}}. Each route's caller was authenticated where it is
// declared (internal/server).
//
//	POST   /webhooks/endpoints                       create (201; the secret, once)
//	GET    /webhooks/endpoints[?workspace_id=]       list
//	GET    /webhooks/endpoints/{id}                  get
//	PATCH  /webhooks/endpoints/{id}                  update
//	DELETE /webhooks/endpoints/{id}                  delete
//	POST   /webhooks/endpoints/{id}/rotate-secret    rotate (the new secret, once)
//	GET    /webhooks/endpoints/{id}/deliveries[?status=&page_size=]
//	POST   /webhooks/deliveries/{id}/redeliver
type REST struct{ S *Service }

var (
	jsonOut = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
	jsonIn  = protojson.UnmarshalOptions{}
)

func (h REST) write(w http.ResponseWriter, r *http.Request, status int, m proto.Message, err error) {
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	b, err := jsonOut.Marshal(m)
	if err != nil {
		rest.WriteError(w, r, apierr.Internal(err), true)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// read decodes the JSON body into m (unknown fields are refused).
func read(w http.ResponseWriter, r *http.Request, m proto.Message) error {
	body, err := rest.ReadBody(w, r, MaxBody, apierr.ReasonPayloadTooLarge)
	if err != nil {
		return err
	}
	if len(body) == 0 {
		return nil
	}
	if err := jsonIn.Unmarshal(body, m); err != nil {
		return apierr.BadRequest("invalid request body: %v", err)
	}
	return nil
}

func call[Req any, Res proto.Message](h REST, w http.ResponseWriter, r *http.Request, status int, req *Req, f func(context.Context, *auth.Principal, *Req) (Res, error)) {
	res, err := f(r.Context(), auth.From(r.Context()), req)
	h.write(w, r, status, res, err)
}

// Create handles POST /api/v1/webhooks/endpoints.
func (h REST) Create(w http.ResponseWriter, r *http.Request) {
	req := &cohortv1.CreateWebhookEndpointRequest{}
	if err := read(w, r, req); err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	call(h, w, r, http.StatusCreated, req, h.S.Create)
}

// List handles GET /api/v1/webhooks/endpoints.
func (h REST) List(w http.ResponseWriter, r *http.Request) {
	call(h, w, r, http.StatusOK, &cohortv1.ListWebhookEndpointsRequest{WorkspaceId: r.URL.Query().Get("workspace_id")}, h.S.List)
}

// Get handles GET /api/v1/webhooks/endpoints/{id}.
func (h REST) Get(w http.ResponseWriter, r *http.Request) {
	call(h, w, r, http.StatusOK, &cohortv1.GetWebhookEndpointRequest{Id: r.PathValue("id")}, h.S.Get)
}

// Update handles PATCH /api/v1/webhooks/endpoints/{id}.
func (h REST) Update(w http.ResponseWriter, r *http.Request) {
	req := &cohortv1.UpdateWebhookEndpointRequest{}
	if err := read(w, r, req); err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	req.Id = r.PathValue("id")
	call(h, w, r, http.StatusOK, req, h.S.Update)
}

// Delete handles DELETE /api/v1/webhooks/endpoints/{id}.
func (h REST) Delete(w http.ResponseWriter, r *http.Request) {
	call(h, w, r, http.StatusOK, &cohortv1.DeleteWebhookEndpointRequest{Id: r.PathValue("id")}, h.S.Delete)
}

// Rotate handles POST /api/v1/webhooks/endpoints/{id}/rotate-secret.
func (h REST) Rotate(w http.ResponseWriter, r *http.Request) {
	call(h, w, r, http.StatusOK, &cohortv1.RotateWebhookSecretRequest{Id: r.PathValue("id")}, h.S.Rotate)
}

// Deliveries handles GET /api/v1/webhooks/endpoints/{id}/deliveries.
func (h REST) Deliveries(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := &cohortv1.ListWebhookDeliveriesRequest{EndpointId: r.PathValue("id"), Status: q.Get("status")}
	if v := q.Get("page_size"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			rest.WriteError(w, r, apierr.BadRequest("page_size must be 1 to 100"), true)
			return
		}
		req.PageSize = int32(n)
	}
	call(h, w, r, http.StatusOK, req, h.S.Deliveries)
}

// Redeliver handles POST /api/v1/webhooks/deliveries/{id}/redeliver.
func (h REST) Redeliver(w http.ResponseWriter, r *http.Request) {
	call(h, w, r, http.StatusOK, &cohortv1.RedeliverWebhookRequest{Id: r.PathValue("id")}, h.S.Redeliver)
}
