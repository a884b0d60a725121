package vault

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/store"
)

// GatewayHandler is InternGatewayService: the door interns' daemons use to
// have the vault release a secret for one request of their http_request
// tool. It is authenticated by the intern's daemon secret, not an API key.
type GatewayHandler struct{ S *Service }

var _ cohortv1connect.InternGatewayServiceHandler = GatewayHandler{}

// NewGatewayHandler returns the service's path and handler. opts must not
// hold the API-key interceptor: daemons present their own secret.
func NewGatewayHandler(s *Service, opts ...connect.HandlerOption) (string, http.Handler) {
	return cohortv1connect.NewInternGatewayServiceHandler(GatewayHandler{S: s}, opts...)
}

// ReleaseSecret checks the daemon's secret against the intern's row, then
// releases through Service.Release (audited, with the run id).
func (h GatewayHandler) ReleaseSecret(ctx context.Context, req *connect.Request[cohortv1.ReleaseSecretRequest]) (*connect.Response[cohortv1.ReleaseSecretResponse], error) {
	if err := h.S.authDaemon(ctx, req.Header().Get("Authorization"), req.Msg.GetInternId()); err != nil {
		return nil, err
	}
	value, err := h.S.Release(ctx, ReleaseRequest{InternID: req.Msg.GetInternId(), Name: req.Msg.GetName(),
		Host: req.Msg.GetHost(), RunID: req.Msg.GetRunId(), Actor: "daemon:" + req.Msg.GetInternId()})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.ReleaseSecretResponse{Value: value}), nil
}

// errDaemonAuth is the one answer for every authentication failure, so a
// caller cannot tell an unknown intern from a wrong secret.
var errDaemonAuth = apierr.Unauthenticated("missing or invalid daemon secret")

func (s *Service) authDaemon(ctx context.Context, header, internID string) error {
	tok, ok := strings.CutPrefix(header, "Bearer ")
	if !ok || tok == "" {
		return errDaemonAuth
	}
	id, err := parseInternID(internID)
	if err != nil {
		return errDaemonAuth
	}
	var in store.Intern
	err = s.DB.NewSelect().Model(&in).Where("id = ? AND state <> ?", id, store.InternDeleted).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return errDaemonAuth
	}
	if err != nil {
		return apierr.Internal(err)
	}
	if !provision.VerifyDaemonSecret(s.KEK, &in, tok) {
		return errDaemonAuth
	}
	return nil
}
