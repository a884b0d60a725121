package server

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/rest"
)

// DefaultMaxBody bounds a request body on a door whose limit the spec does
// not set (every Connect service but chat and the vault): the largest valid
// request of those services is a few KB (ADR 0020).
const DefaultMaxBody = 64 << 10

// gzipSlack is what a gzip body may exceed its limit by on the wire: the
// header and trailer, and deflate's stored blocks for a body that does not
// compress (5 bytes per 64 KB block).
func gzipSlack(limit int64) int64 { return 64 + limit/1024 }

// door is what bodyLimit needs to know of a route: its limit, and how it
// answers a refusal (the route family's error body).
type door struct {
	limit int64
	// connect: the door speaks Connect (a refusal is a Connect error);
	// procedures are its service's, with Prefix stripped.
	connect    bool
	procedures map[string]bool
	// reasons: the REST family's error body carries metadata.reason.
	reasons bool
	// self: the handler bounds and decodes its body itself, before it
	// looks at any credential (the token exchange: its form, its OAuth
	// error body). The body is still capped at limit here.
	self bool
}

var connectErrors = connect.NewErrorWriter()

// refuse answers err in the door's error body. A Connect refusal keeps
// err's HTTP status (413, 415), which connect-go would map from its code
// (resource_exhausted is 429): clients read the code from the body.
func (d door) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if !d.connect {
		rest.WriteError(w, r, err, d.reasons)
		return
	}
	e := apierr.From(err)
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	connectErrors.Write(statusAs{ResponseWriter: w, status: e.Status}, r, apierr.ToConnect(err))
}

// statusAs writes status in place of any error status connect-go picks.
type statusAs struct {
	http.ResponseWriter
	status int
}

func (s statusAs) WriteHeader(code int) {
	if code != http.StatusOK {
		code = s.status
	}
	s.ResponseWriter.WriteHeader(code)
}

// bodyLimit bounds a route's request body before anything else reads it:
// before authentication, before Connect picks or decodes a procedure. A
// body declared or found larger than the door's limit, compressed or once
// decompressed, is a 413 at once; an encoding other than gzip a 415; a
// Connect procedure the service does not have a 404 that never reads the
// body. A unary body is read here, at most limit bytes, and handed on
// decompressed, so that what comes after sees a plain body; a streaming
// request (Connect streaming, gRPC) is capped on the wire and its
// messages by connect-go's read limit (WithReadMaxBytes, set per service).
func bodyLimit(d door, next http.Handler) http.Handler {
	if d.limit <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.connect && !d.procedures[r.URL.Path] {
			d.refuse(w, r, apierr.NotFound("no procedure %s", r.URL.Path))
			return
		}
		if d.self {
			r.Body = http.MaxBytesReader(w, r.Body, d.limit)
			next.ServeHTTP(w, r)
			return
		}
		tooLarge := apierr.New(http.StatusRequestEntityTooLarge, apierr.ReasonPayloadTooLarge, "request body exceeds %d bytes", d.limit)
		gz := false
		switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
		case "", "identity":
		case "gzip":
			gz = true
		default:
			d.refuse(w, r, apierr.New(http.StatusUnsupportedMediaType, apierr.ReasonBadRequest,
				"Content-Encoding %q is not supported: send the body as is, or gzip", enc))
			return
		}
		wire := d.limit
		if gz {
			wire += gzipSlack(d.limit)
		}
		if r.ContentLength > wire {
			rest.Drain(w, r.Body)
			d.refuse(w, r, tooLarge)
			return
		}
		if d.connect && streamingType(r.Header.Get("Content-Type")) {
			// One message (chat's server stream) and its envelope; each
			// message's own encoding is connect-go's, bounded by its read
			// limit.
			r.Body = http.MaxBytesReader(w, r.Body, wire+5)
			next.ServeHTTP(w, r)
			return
		}
		body, err := readBounded(w, r.Body, d.limit, wire, gz, r.ContentLength)
		if err != nil {
			var mb *http.MaxBytesError
			switch {
			case errors.As(err, &mb) || errors.Is(err, errInflatesPast):
				rest.Drain(w, r.Body)
				d.refuse(w, r, tooLarge)
			case gz:
				d.refuse(w, r, apierr.BadRequest("the gzip request body does not decompress"))
			default:
				d.refuse(w, r, apierr.BadRequest("could not read request body"))
			}
			return
		}
		r.Header.Del("Content-Encoding")
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
		next.ServeHTTP(w, r)
	})
}

var errInflatesPast = errors.New("body inflates past the limit")

// readBounded reads at most wire bytes of body and, for gzip, at most
// limit bytes of what they inflate to. A plain body of a declared length
// (already checked against wire) is read into one buffer of that size.
func readBounded(w http.ResponseWriter, body io.ReadCloser, limit, wire int64, gz bool, declared int64) ([]byte, error) {
	var src io.Reader = http.MaxBytesReader(w, body, wire)
	if !gz && declared >= 0 {
		b := make([]byte, declared)
		if _, err := io.ReadFull(src, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	if gz {
		zr, err := gzip.NewReader(src)
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		src = io.LimitReader(zr, limit+1)
	}
	b, err := io.ReadAll(src)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		if gz {
			return nil, errInflatesPast
		}
		return nil, &http.MaxBytesError{Limit: limit}
	}
	return b, nil
}

func streamingType(ct string) bool {
	return strings.HasPrefix(ct, "application/connect+") || strings.HasPrefix(ct, "application/grpc")
}
