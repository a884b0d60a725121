package testenv

import (
	"encoding/json"
	"fmt"
)

// ErrorShape checks a REST error body of the chat, vault and workspace
// families: exactly {"error":{"code":status,"message":"…"}}, plus
// "metadata":{"reason":"…"} where the family carries one.
func ErrorShape(status int, body string) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &top); err != nil || len(top) != 1 || top["error"] == nil {
		return fmt.Errorf("%d: body is not {\"error\":{…}}: %q", status, body)
	}
	var e struct {
		Code     int               `json:"code"`
		Message  string            `json:"message"`
		Metadata map[string]string `json:"metadata"`
	}
	var fields map[string]json.RawMessage
	json.Unmarshal(top["error"], &fields)
	if err := json.Unmarshal(top["error"], &e); err != nil || e.Code != status || e.Message == "" {
		return fmt.Errorf("%d: error object %s", status, top["error"])
	}
	for k := range fields {
		if k != "code" && k != "message" && k != "metadata" {
			return fmt.Errorf("%d: unexpected member %q in %s", status, k, top["error"])
		}
	}
	if fields["metadata"] != nil && (len(e.Metadata) != 1 || e.Metadata["reason"] == "") {
		return fmt.Errorf("%d: metadata %s", status, fields["metadata"])
	}
	return nil
}

// SendableHeader reports whether v can be sent as a header value at all
// (the client refuses control characters): fuzz targets skip the others.
func SendableHeader(v string) bool {
	for _, r := range v {
		if (r < 0x20 && r != '\t') || r == 0x7f {
			return false
		}
	}
	return true
}
