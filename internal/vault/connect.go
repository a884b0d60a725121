package vault

import (
	"context"
	"net/http"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/auth"
)

// Handler is the Connect door onto Service.
type Handler struct{ S *Service }

var _ cohortv1connect.VaultServiceHandler = Handler{}

// PutInternSecret creates or replaces a secret; see Service.Put.
func (h Handler) PutInternSecret(ctx context.Context, req *connect.Request[cohortv1.PutInternSecretRequest]) (*connect.Response[cohortv1.PutInternSecretResponse], error) {
	res, err := h.S.Put(ctx, auth.From(ctx), requestHost(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// NewConnectHandler returns the Connect door's path and handler, with the
// vault's body bound and the request host passed on for the regional gate.
func NewConnectHandler(s *Service, opts ...connect.HandlerOption) (string, http.Handler) {
	path, h := cohortv1connect.NewVaultServiceHandler(Handler{S: s}, append(opts, connect.WithReadMaxBytes(MaxBody))...)
	return path, WithRequestHost(h)
}

type hostKey struct{}

// WithRequestHost passes the request's Host header to the Connect door,
// which the regional-hostname gate needs and connect-go does not expose.
func WithRequestHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), hostKey{}, r.Host)))
	})
}

func requestHost(ctx context.Context) string {
	h, _ := ctx.Value(hostKey{}).(string)
	return h
}
