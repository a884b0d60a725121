package jsonstr

import (
	"bytes"
	"encoding/json"
	"testing"
)

func marshal(t testing.TB, s string, html bool) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(html)
	if err := enc.Encode(s); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

var cases = []string{"", "plain", `q"b\s`, "\b\f\n\r\t\x00\x1f\x7f", "<a href='x'>&amp;</a>",
	"line\u2028para\u2029", "bad\xffutf8\xc3", "é漢字🙂", "\xed\xa0\x80 surrogate"}

func TestAppendIsMarshal(t *testing.T) {
	for _, html := range []bool{true, false} {
		for _, s := range cases {
			if got, want := Append([]byte("x"), s, html), append([]byte("x"), marshal(t, s, html)...); !bytes.Equal(got, want) {
				t.Errorf("html=%v %q: got %s, want %s", html, s, got, want)
			}
		}
	}
}

func FuzzAppend(f *testing.F) {
	for _, s := range cases {
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, s string, html bool) {
		if got, want := Append(nil, s, html), marshal(t, s, html); !bytes.Equal(got, want) {
			t.Fatalf("html=%v %q: got %s, want %s", html, s, got, want)
		}
	})
}
