package federation

import (
	"strconv"

	"github.com/cohort-dev/cohort/internal/jsonstr"
)

// The exchange writes two small JSON documents per call, the access
// token's claims and the response body, with fixed shapes. Appending them
// by hand costs a fraction of encoding/json's reflection
// (docs/benchmarks.md); the bytes are exactly what json.Marshal writes for
// the same values (signing_internal_test.go compares them).

// appendJSONString appends s as json.Marshal writes a string.
func appendJSONString(dst []byte, s string) []byte { return jsonstr.Append(dst, s, true) }

// appendJSONMember appends `"name":` and the string value, preceded by a
// comma unless it is the object's first member (dst ends with '{').
func appendJSONMember(dst []byte, name, value string) []byte {
	dst = appendJSONName(dst, name)
	return appendJSONString(dst, value)
}

func appendJSONName(dst []byte, name string) []byte {
	if len(dst) > 0 && dst[len(dst)-1] != '{' {
		dst = append(dst, ',')
	}
	dst = appendJSONString(dst, name)
	return append(dst, ':')
}

func appendJSONInt(dst []byte, name string, v int64) []byte {
	dst = appendJSONName(dst, name)
	return strconv.AppendInt(dst, v, 10)
}
