package store_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The dialect differences live in internal/store only (ADR 0049): no
// product file elsewhere imports bun's dialect packages or asks a database
// for its dialect; it calls store's helpers, named after the capability.
// Tests may (they check what a dialect does).
func TestNoDialectOutsideStore(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	storeDir := filepath.Join(root, "internal", "store")
	fset := token.NewFileSet()
	files := 0
	var found []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" || name == "node_modules") || path == storeDir {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		rel, _ := filepath.Rel(root, path)
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if p == "github.com/uptrace/bun/dialect" || strings.HasPrefix(p, "github.com/uptrace/bun/dialect/") {
				found = append(found, rel+": imports "+p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok {
				if s, ok := c.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == "Dialect" && len(c.Args) == 0 {
					found = append(found, fset.Position(c.Pos()).String()[len(root)+1:]+": calls Dialect()")
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked %d Go files under %s: not the module", files, root)
	}
	for _, f := range found {
		t.Errorf("%s: dialect differences belong in internal/store (a helper named after the capability)", f)
	}
}
