package federation

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// referenceDecodeObject is the claims decoder decodeObject replaced:
// json.Unmarshal, then UTF-8, then duplicate names found by counting the
// top-level names in the bytes. decodeObject must agree with it on every
// input: the same map, or the same error.
func referenceDecodeObject(b []byte) (map[string]any, error) {
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, errors.New("not a JSON object")
		}
		return nil, errors.New("not JSON")
	}
	if out == nil {
		return nil, errors.New("not a JSON object")
	}
	if !utf8.Valid(b) {
		return nil, errors.New("not UTF-8")
	}
	if n := referenceTopLevelNames(b); n != len(out) {
		return nil, errors.New("a member name appears twice")
	}
	return out, nil
}

func referenceTopLevelNames(b []byte) int {
	depth, names := 0, 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case '"':
			j := i + 1
			for ; j < len(b) && b[j] != '"'; j++ {
				if b[j] == '\\' {
					j++
				}
			}
			if depth == 1 {
				k := j + 1
				for k < len(b) && (b[k] == ' ' || b[k] == '\t' || b[k] == '\n' || b[k] == '\r') {
					k++
				}
				if k < len(b) && b[k] == ':' {
					names++
				}
			}
			i = j
		}
	}
	return names
}

var decodeSeeds = []string{
	`{}`, ` { } `, `{"a":1}`, `{"iss":"https://x","sub":"repo:a/b","aud":["cohort","x"],"exp":1900000000,"nbf":1.5e9,"iat":-0.25E+2}`,
	`{"a":{"b":{"c":[1,2,{"d":null}]}},"e":true,"f":false,"g":null,"h":[],"i":{}}`,
	`{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `{"a":{"b":1,"b":2}}`, `{"a":[{"b":1},{"b":2}],"c":{"a":1}}`,
	`{"s":"\"\\\/\b\f\n\r\t\u00e9\u20AC\ud83d\ude00"}`, `{"s":"\ud800"}`, `{"s":"\ud800\u0041"}`, `{"s":"\udc00\ud800"}`,
	`{"s":"\ud800\n"}`, `{"\ud800":1,"\ufffd":2}`, `{"s":"\uD83D\uDE00x"}`, `{"s":"\u12"}`, `{"s":"\uzzzz"}`, `{"s":"\x"}`,
	"{\"s\":\"a\x01b\"}", "{\"s\":\"\x7f\"}", "{\"s\":\"\xff\"}", "{\"\xc3\":1}", "{\"s\":\"é\"}",
	`{"n":1e400}`, `{"n":-1e400,"x":}`, `{"n":1e-400}`, `{"n":01}`, `{"n":-}`, `{"n":1.}`, `{"n":.5}`, `{"n":+1}`, `{"n":1e}`,
	`{"n":-0}`, `{"n":0.0e0}`, `{"n":123456789012345678901234567890}`,
	`[]`, `[1]`, `"s"`, `1`, `1e400`, `null`, `true`, ``, ` `, `{`, `}`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,}`, `{"a":1 "b":2}`,
	`{"a":1}x`, `{"a":1}{}`, `{"a":[1,]}`, `{"a":[,1]}`, `{"a":tru}`, `{"a":truex}`, `{"a":nul}`, `{'a':1}`, `{a:1}`,
	"{\"a\":1}\n\t\r ", "\xef\xbb\xbf{}", `{"a":"b"`, `{"a":"b\"}`, `{"a"  :  [ 1 , 2 ]  }`,
	`{"a":1,"b":{"a":1},"c":"\"a\":"}`, `{"a\"b":1,"a\"b":2}`,
}

// FuzzDecodeObject: decodeObject gives what the reference gives.
func FuzzDecodeObject(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecodeObject(t, b)
	})
}

func checkDecodeObject(t *testing.T, b []byte) {
	t.Helper()
	got, gotErr := decodeObject(b)
	want, wantErr := referenceDecodeObject(b)
	if (gotErr == nil) != (wantErr == nil) || gotErr != nil && gotErr.Error() != wantErr.Error() {
		t.Fatalf("%q: error %v, want %v", b, gotErr, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\n got %#v\nwant %#v", b, got, want)
	}
}

// TestDecodeObjectDepth: json's nesting limit, at and past it.
func TestDecodeObjectDepth(t *testing.T) {
	for _, n := range []int{9999, 10000, 10001} {
		checkDecodeObject(t, []byte(`{"a":`+strings.Repeat("[", n-1)+strings.Repeat("]", n-1)+`}`))
	}
}
