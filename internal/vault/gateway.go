package vault

import (
	"context"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/provision"
)

// GatewayHandler is InternGatewayService: the door interns' daemons use to
// have the vault release a secret for one request of their http_request
// tool. It is authenticated by the daemon's own credential, derived from
// the intern's daemon secret (launch.DaemonCredential), not an API key:
// what the gateway presents to the daemon, if a program in the jail
// captured it, is refused here.
type GatewayHandler struct{ S *Service }

var _ cohortv1connect.InternGatewayServiceHandler = GatewayHandler{}

// NewGatewayHandler returns the service's path and handler. opts must not
// hold the API-key interceptor: daemons present their own secret.
func NewGatewayHandler(s *Service, opts ...connect.HandlerOption) (string, http.Handler) {
	// Answers are a few hundred bytes: gzip would cost more than it saves
	// on a call every secret-bearing request waits for.
	return cohortv1connect.NewInternGatewayServiceHandler(GatewayHandler{S: s}, append(opts, connect.WithCompressMinBytes(4096))...)
}

// ReleaseSecret checks the daemon's credential against the intern's row, then
// releases through Service.Release (audited, with the run id).
func (h GatewayHandler) ReleaseSecret(ctx context.Context, req *connect.Request[cohortv1.ReleaseSecretRequest]) (*connect.Response[cohortv1.ReleaseSecretResponse], error) {
	in, err := h.S.authDaemon(ctx, req.Header().Get("Authorization"), req.Msg.GetInternId())
	if err != nil {
		return nil, err
	}
	value, err := h.S.Release(ctx, ReleaseRequest{InternID: in.ID, Name: req.Msg.GetName(),
		Host: req.Msg.GetHost(), RunID: req.Msg.GetRunId(), Actor: "daemon:" + in.ID, intern: &in.Intern, programme: in.Programme})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.ReleaseSecretResponse{Value: value}), nil
}

// HostBound checks the daemon's credential, then says whether the intern
// has a secret bound to the host (Service.Bound): a remote jail's proxy
// intercepts only such hosts (ADR 0931).
func (h GatewayHandler) HostBound(ctx context.Context, req *connect.Request[cohortv1.HostBoundRequest]) (*connect.Response[cohortv1.HostBoundResponse], error) {
	in, err := h.S.authDaemon(ctx, req.Header().Get("Authorization"), req.Msg.GetInternId())
	if err != nil {
		return nil, err
	}
	bound, err := h.S.Bound(ctx, in.ID, req.Msg.GetHost())
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return connect.NewResponse(&cohortv1.HostBoundResponse{Bound: bound}), nil
}

// errDaemonAuth is the one answer for every authentication failure, so a
// caller cannot tell an unknown intern from a wrong secret.
var errDaemonAuth = apierr.Unauthenticated("missing or invalid daemon secret")

// authDaemon returns the live intern whose daemon credential the header
// carries (with its programme flag, which the release checks).
func (s *Service) authDaemon(ctx context.Context, header, internID string) (*internRow, error) {
	tok, ok := strings.CutPrefix(header, "Bearer ")
	if !ok || tok == "" {
		return nil, errDaemonAuth
	}
	id, err := parseInternID(internID)
	if err != nil {
		return nil, errDaemonAuth
	}
	in, err := s.loadIntern(ctx, id)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if in == nil || !provision.VerifyDaemonSecret(s.KEK, &in.Intern, tok) {
		return nil, errDaemonAuth
	}
	return in, nil
}
