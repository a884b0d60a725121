package keys_test

import (
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/keys"
)

func TestNewKeys(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, kind := range []string{"management", "workspace", "personal"} {
		for range 50 {
			k, h, err := keys.New(kind)
			if err != nil {
				t.Fatal(err)
			}
			if !keys.WellFormed(k) {
				t.Fatalf("key %q not well formed", keys.Display(k))
			}
			if seen[k] {
				t.Fatal("duplicate key")
			}
			seen[k] = true
			if h != keys.Hash(k) || strings.Contains(h, k) || len(h) != 64 {
				t.Fatalf("hash %q is not the SHA-256 of the key", h)
			}
		}
	}
	if _, _, err := keys.New("root"); err == nil {
		t.Fatal("unknown kind accepted")
	}
}

func TestPrefixesAndShape(t *testing.T) {
	t.Parallel()
	k, _, _ := keys.New("management")
	if !strings.HasPrefix(k, "cohort_mk_") || len(k) != len("cohort_mk_")+43 {
		t.Fatalf("management key %q has the wrong shape", keys.Display(k))
	}
	if d := keys.Display(k); d != k[:len("cohort_mk_")+4] {
		t.Fatalf("display %q", d)
	}
	for _, bad := range []string{"", "cohort_mk_", "cohort_mk_short", k + "x", k[:len(k)-1], "cohort_xk_" + k[10:], strings.Replace(k, k[12:13], "!", 1)} {
		if keys.WellFormed(bad) {
			t.Errorf("WellFormed(%q) = true", bad)
		}
	}
}
