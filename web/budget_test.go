package web_test

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestFirstLoadBudget: the JavaScript index.html loads (every script and
// module preload it names) stays under 300 kB gzipped, as Vite counts it.
func TestFirstLoadBudget(t *testing.T) {
	t.Parallel()
	html, err := os.ReadFile(filepath.Join("dist", "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	refs := regexp.MustCompile(`(?:src|href)="/(assets/[^"]+\.js)"`).FindAllSubmatch(html, -1)
	if len(refs) == 0 {
		t.Fatal("index.html loads no script")
	}
	total := 0
	for _, m := range refs {
		js, err := os.ReadFile(filepath.Join("dist", string(m[1])))
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		zw.Write(js)
		zw.Close()
		total += buf.Len()
	}
	const budget = 300_000
	if total >= budget {
		t.Fatalf("first load is %d bytes of JavaScript gzipped, budget %d", total, budget)
	}
	t.Logf("first load: %d bytes of JavaScript gzipped (budget %d)", total, budget)
}
