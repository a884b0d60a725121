// Package client is Cohort's typed Go client: every public Connect service
// of the API, over one base URL and one credential.
//
//	c := client.New("http://127.0.0.1:8080/api/v1", os.Getenv("WK"))
//	res, err := c.Interns.ListInterns(ctx, connect.NewRequest(&cohortv1.ListInternsRequest{}))
//
// The credential (an API key, or a federation access token) goes on every
// call, unary and streaming alike; errors are connect errors whose code
// follows the API's status and whose details carry a cohortv1.ErrorDetail
// with the spec's reason (Reason).
package client

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
)

// Client holds a client of each service. Its fields are safe for
// concurrent use.
type Client struct {
	Workspaces cohortv1connect.WorkspaceServiceClient
	Interns    cohortv1connect.InternServiceClient
	Chat       cohortv1connect.ChatServiceClient
	Runs       cohortv1connect.RunServiceClient
	Vault      cohortv1connect.VaultServiceClient
	VaultAdmin cohortv1connect.VaultAdminServiceClient
	Federation cohortv1connect.FederationServiceClient
	Webhooks   cohortv1connect.WebhookServiceClient
	Admin      cohortv1connect.AdminServiceClient
}

type options struct {
	http    connect.HTTPClient
	connect []connect.ClientOption
}

// Option configures New.
type Option func(*options)

// WithHTTPClient sends the calls through c (its transport, timeouts,
// proxies, TLS roots) instead of http.DefaultClient. A chat stream lasts
// as long as its turn: give c no overall Timeout, or a long one.
func WithHTTPClient(c connect.HTTPClient) Option { return func(o *options) { o.http = c } }

// WithConnectOptions adds connect-go client options (the gRPC protocol,
// compression, more interceptors) after the credential's.
func WithConnectOptions(opts ...connect.ClientOption) Option {
	return func(o *options) { o.connect = append(o.connect, opts...) }
}

// New returns a client of the API at baseURL (the gateway's address with
// /api/v1, e.g. http://127.0.0.1:8080/api/v1) that presents key.
func New(baseURL, key string, opts ...Option) *Client {
	o := options{http: http.DefaultClient}
	for _, f := range opts {
		f(&o)
	}
	baseURL = strings.TrimRight(baseURL, "/")
	co := append([]connect.ClientOption{connect.WithInterceptors(Bearer(key))}, o.connect...)
	return &Client{
		Workspaces: cohortv1connect.NewWorkspaceServiceClient(o.http, baseURL, co...),
		Interns:    cohortv1connect.NewInternServiceClient(o.http, baseURL, co...),
		Chat:       cohortv1connect.NewChatServiceClient(o.http, baseURL, co...),
		Runs:       cohortv1connect.NewRunServiceClient(o.http, baseURL, co...),
		Vault:      cohortv1connect.NewVaultServiceClient(o.http, baseURL, co...),
		VaultAdmin: cohortv1connect.NewVaultAdminServiceClient(o.http, baseURL, co...),
		Federation: cohortv1connect.NewFederationServiceClient(o.http, baseURL, co...),
		Webhooks:   cohortv1connect.NewWebhookServiceClient(o.http, baseURL, co...),
		Admin:      cohortv1connect.NewAdminServiceClient(o.http, baseURL, co...),
	}
}

// Bearer is an interceptor that puts key in the Authorization header of
// every call, streams included (connect.UnaryInterceptorFunc alone skips
// streams: their calls then fail unauthenticated).
func Bearer(key string) connect.Interceptor { return bearer("Bearer " + key) }

type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// Reason is the spec's reason of an API error (rate_limited,
// interaction_not_pending, …), "" when err carries none.
func Reason(err error) string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return ""
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if e, ok := v.(*cohortv1.ErrorDetail); ok {
				return e.GetReason()
			}
		}
	}
	return ""
}
