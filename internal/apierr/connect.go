package apierr

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
)

// codeFor maps an HTTP status to the Connect code a typed client expects.
func codeFor(status int) connect.Code {
	switch status {
	case http.StatusBadRequest:
		return connect.CodeInvalidArgument
	case http.StatusUnauthorized:
		return connect.CodeUnauthenticated
	case http.StatusForbidden:
		return connect.CodePermissionDenied
	case http.StatusNotFound:
		return connect.CodeNotFound
	case http.StatusConflict:
		return connect.CodeFailedPrecondition
	case http.StatusGone:
		return connect.CodeOutOfRange
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return connect.CodeResourceExhausted
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return connect.CodeUnavailable
	case http.StatusGatewayTimeout:
		return connect.CodeDeadlineExceeded
	case 499:
		return connect.CodeCanceled
	default:
		return connect.CodeInternal
	}
}

// ToConnect maps any error to a Connect error with an ErrorDetail carrying
// the reason and HTTP status. Non-*Error values become "internal error".
func ToConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	e := From(err)
	out := connect.NewError(codeFor(e.Status), errors.New(e.Message))
	if d, derr := connect.NewErrorDetail(&cohortv1.ErrorDetail{Reason: string(e.Reason), HttpStatus: int32(e.Status)}); derr == nil {
		out.AddDetail(d)
	}
	if e.RetryAfter > 0 {
		out.Meta().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	return out
}

// FromConnect turns a Connect error received from another Cohort process
// (a gateway replica, an intern daemon) back into an *Error. A Connect error
// without our detail keeps its message and gets a status from its code.
func FromConnect(err error) *Error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return From(err)
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if det, ok := v.(*cohortv1.ErrorDetail); ok {
			return &Error{Status: int(det.GetHttpStatus()), Reason: Reason(det.GetReason()), Message: ce.Message(), Cause: err,
				RetryAfter: retryAfter(ce)}
		}
	}
	status := http.StatusInternalServerError
	switch ce.Code() {
	case connect.CodeInvalidArgument:
		status = http.StatusBadRequest
	case connect.CodeUnauthenticated:
		status = http.StatusUnauthorized
	case connect.CodePermissionDenied:
		status = http.StatusForbidden
	case connect.CodeNotFound:
		status = http.StatusNotFound
	case connect.CodeFailedPrecondition, connect.CodeAborted, connect.CodeAlreadyExists:
		status = http.StatusConflict
	case connect.CodeResourceExhausted:
		status = http.StatusTooManyRequests
	case connect.CodeUnavailable:
		status = http.StatusServiceUnavailable
	case connect.CodeDeadlineExceeded:
		status = http.StatusGatewayTimeout
	case connect.CodeCanceled:
		status = 499
	}
	return &Error{Status: status, Message: ce.Message(), Cause: err, RetryAfter: retryAfter(ce)}
}

// retryAfter is the Retry-After (seconds) a Connect error carries, 0 when
// none: a daemon's refusal passes it on to the gateway's caller.
func retryAfter(ce *connect.Error) int {
	n, err := strconv.Atoi(ce.Meta().Get("Retry-After"))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// ConnectInterceptor maps every handler error to ToConnect, so handlers
// return domain errors and never build Connect errors themselves. Server
// faults are logged with their cause; the client sees only the safe message.
func ConnectInterceptor(log *slog.Logger) connect.Interceptor { return interceptor{log: log} }

type interceptor struct{ log *slog.Logger }

func (i interceptor) convert(ctx context.Context, procedure string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || connect.CodeOf(err) == connect.CodeCanceled) {
		// The caller hung up: not a fault of ours (logged as 499, as
		// the REST doors do), and nobody reads the answer.
		if i.log != nil {
			i.log.InfoContext(ctx, "request cancelled by the caller", "procedure", procedure, "status", 499)
		}
		return ToConnect(err)
	}
	// A Connect error the framework raised (a request past the read bound,
	// a malformed envelope) keeps its code's status: the caller's fault is
	// not logged as ours.
	if e := FromConnect(err); e.Status >= 500 {
		LogFault(ctx, i.log, e, slog.String("procedure", procedure))
	}
	return ToConnect(err)
}

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		return res, i.convert(ctx, req.Spec().Procedure, err)
	}
}

func (i interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return i.convert(ctx, conn.Spec().Procedure, next(ctx, conn))
	}
}
