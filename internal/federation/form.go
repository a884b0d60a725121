package federation

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/cohort-dev/cohort/internal/apierr"
)

// The token exchange's fixed values (RFC 8693).
const (
	GrantTokenExchange   = "urn:ietf:params:oauth:grant-type:token-exchange"
	TokenTypeJWT         = "urn:ietf:params:oauth:token-type:jwt"
	TokenTypeAccessToken = "urn:ietf:params:oauth:token-type:access_token"
	scopeInference       = "inference"
)

// MaxTokenBody is the largest accepted exchange body. The spec says "under
// 32 KB": 32767 bytes are accepted and 32768 refused.
const MaxTokenBody = 32<<10 - 1

// The exchange's refusals are *apierr.Error values whose reason is an RFC
// 6749 §5.2 error code (and RFC 8693's use of them); the REST door writes
// them as {"error": reason, "error_description": message} with the error's
// status and Retry-After. Anything else (an outage, a bug) is answered 500
// server_error and logged.
const (
	ReasonInvalidRequest         apierr.Reason = "invalid_request"
	ReasonInvalidGrant           apierr.Reason = "invalid_grant"
	ReasonUnsupportedGrantType   apierr.Reason = "unsupported_grant_type"
	ReasonInvalidScope           apierr.Reason = "invalid_scope"
	ReasonTemporarilyUnavailable apierr.Reason = "temporarily_unavailable"
	ReasonServerError            apierr.Reason = "server_error"
)

// oauthReasons are the reasons the token endpoint writes as they are.
var oauthReasons = map[apierr.Reason]bool{ReasonInvalidRequest: true, ReasonInvalidGrant: true,
	ReasonUnsupportedGrantType: true, ReasonInvalidScope: true, ReasonTemporarilyUnavailable: true}

func invalidRequest(format string, args ...any) *apierr.Error {
	return apierr.New(http.StatusBadRequest, ReasonInvalidRequest, format, args...)
}

// invalidGrantDescription is the one message of every invalid_grant: the
// caller learns nothing about which check failed (the audit does).
const invalidGrantDescription = "the subject token was not accepted for this federation policy"

// errInvalidGrant is the one invalid_grant answer.
var errInvalidGrant = apierr.New(http.StatusBadRequest, ReasonInvalidGrant, "%s", invalidGrantDescription)

var errTemporarilyUnavailable = apierr.New(http.StatusServiceUnavailable, ReasonTemporarilyUnavailable,
	"the identity provider's keys could not be fetched; retry shortly").Retry(apierr.RetryUnavailable)

// errAuditUnavailable: the exchange passed but its audit row could not be
// written, so no token is handed out.
var errAuditUnavailable = apierr.New(http.StatusServiceUnavailable, ReasonTemporarilyUnavailable,
	"the exchange could not be recorded; retry shortly").Retry(apierr.RetryUnavailable)

// TokenRequest is a decoded exchange form.
type TokenRequest struct {
	GrantType          string
	SubjectTokenType   string
	SubjectToken       string
	PolicyID           string
	RequestedTokenType string
	Scope              string
}

// formField returns where parameter key goes and its bit in the set of
// parameters seen, or nil for a parameter we do not read. We read each
// of these once; audience and resource may repeat (RFC 8693 §2.1) and are
// ignored; any other parameter is ignored too (RFC 6749 §3.2).
func (r *TokenRequest) formField(key string) (*string, uint8) {
	switch key {
	case "grant_type":
		return &r.GrantType, 1 << 0
	case "subject_token_type":
		return &r.SubjectTokenType, 1 << 1
	case "subject_token":
		return &r.SubjectToken, 1 << 2
	case "federation_policy_id":
		return &r.PolicyID, 1 << 3
	case "requested_token_type":
		return &r.RequestedTokenType, 1 << 4
	case "scope":
		return &r.Scope, 1 << 5
	}
	return nil, 0
}

// maxPolicyID bounds federation_policy_id; ids are UUIDs (36 bytes).
const maxPolicyID = 64

// formUnescape is url.QueryUnescape, which allocates even when there is
// nothing to decode; most of a form (a JWT, a UUID) has nothing.
func formUnescape(s string) (string, error) {
	if !strings.ContainsAny(s, "%+") {
		return s, nil
	}
	return url.QueryUnescape(s)
}

// ParseTokenForm decodes an application/x-www-form-urlencoded exchange body
// and applies every field rule of the spec, in a fixed order, so that one
// body always gives the same error. A parameter sent without a value counts
// as omitted (RFC 6749 §3.1); a parameter we read that is sent twice is
// refused (RFC 6749 §3.2).
func ParseTokenForm(body []byte) (*TokenRequest, error) { return parseTokenForm(string(body)) }

// parseTokenForm is ParseTokenForm; the request's values are substrings
// of body.
func parseTokenForm(body string) (*TokenRequest, error) {
	r := &TokenRequest{}
	var seen uint8
	for pair := range strings.SplitSeq(body, "&") {
		if pair == "" {
			continue
		}
		rawKey, rawValue, _ := strings.Cut(pair, "=")
		key, err := formUnescape(rawKey)
		if err != nil {
			return nil, invalidRequest("the body is not valid form encoding")
		}
		field, bit := r.formField(key)
		if field == nil {
			continue
		}
		if seen&bit != 0 {
			return nil, invalidRequest("parameter %s is sent more than once", key)
		}
		seen |= bit
		value, err := formUnescape(rawValue)
		if err != nil {
			return nil, invalidRequest("parameter %s is not valid form encoding", key)
		}
		*field = value
	}
	switch {
	case r.GrantType == "":
		return nil, invalidRequest("grant_type is required")
	case r.GrantType != GrantTokenExchange:
		return nil, apierr.New(http.StatusBadRequest, ReasonUnsupportedGrantType, "grant_type must be %s", GrantTokenExchange)
	case r.SubjectToken == "":
		return nil, invalidRequest("subject_token is required")
	case len(r.SubjectToken) > MaxSubjectToken:
		return nil, invalidRequest("subject_token must be at most %d bytes", MaxSubjectToken)
	case r.SubjectTokenType == "":
		return nil, invalidRequest("subject_token_type is required: %s", TokenTypeJWT)
	case r.SubjectTokenType != TokenTypeJWT:
		return nil, invalidRequest("subject_token_type must be %s", TokenTypeJWT)
	case r.PolicyID == "":
		return nil, invalidRequest("federation_policy_id is required")
	case len(r.PolicyID) > maxPolicyID:
		return nil, invalidRequest("federation_policy_id is malformed")
	case r.RequestedTokenType != "" && r.RequestedTokenType != TokenTypeAccessToken:
		return nil, invalidRequest("requested_token_type must be %s", TokenTypeAccessToken)
	case r.Scope != "" && r.Scope != scopeInference:
		return nil, apierr.New(http.StatusBadRequest, ReasonInvalidScope, "the only scope is inference")
	}
	return r, nil
}

// checkFormContentType accepts application/x-www-form-urlencoded, with or
// without parameters such as charset.
func checkFormContentType(ct string) error {
	mt, _, _ := strings.Cut(ct, ";")
	if !strings.EqualFold(strings.TrimSpace(mt), "application/x-www-form-urlencoded") {
		return invalidRequest("the body must be application/x-www-form-urlencoded")
	}
	return nil
}
