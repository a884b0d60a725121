package apierr_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"testing"
)

// Every reason the spec lists has its constant, named after it, and no two
// constants share a value (ADR 0953).
func TestReasonsCoverTheSpec(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "apierr.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	byValue := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Values) != 1 {
			return true
		}
		if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Reason" {
			return true
		}
		v, err := strconv.Unquote(vs.Values[0].(*ast.BasicLit).Value)
		if err != nil {
			t.Fatal(err)
		}
		if other, dup := byValue[v]; dup {
			t.Errorf("%s and %s are both %q", other, vs.Names[0].Name, v)
		}
		byValue[v] = vs.Names[0].Name
		return true
	})
	spec, err := os.ReadFile("../../docs/spec/api-v1.md")
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile("The full set of `reason` values: (.*)").FindSubmatch(spec)
	if line == nil {
		t.Fatal("the spec's list of reasons is not where it was")
	}
	camel := regexp.MustCompile(`(?:^|_)([a-z])`)
	listed := regexp.MustCompile("`([a-z_]+)`").FindAllSubmatch(line[1], -1)
	if len(listed) < 10 {
		t.Fatalf("read %d reasons from the spec's list", len(listed))
	}
	for _, m := range listed {
		v := string(m[1])
		want := "Reason" + camel.ReplaceAllStringFunc(v, func(s string) string { return string(s[len(s)-1] - 'a' + 'A') })
		if byValue[v] != want {
			t.Errorf("the spec's reason %q has no constant %s (found %q)", v, want, byValue[v])
		}
	}
}
