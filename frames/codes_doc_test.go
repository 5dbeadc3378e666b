package frames_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"testing"
)

// TestCodes_Documented: every error code declared in errors.go has a row
// in docs/protocol.md's error code tables (§7), and every row there names
// a declared code.
func TestCodes_Documented(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || vs.Type == nil {
			return true
		}
		if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
			return true
		}
		for _, v := range vs.Values {
			if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				code, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				declared[code] = true
			}
		}
		return true
	})
	if len(declared) < 20 {
		t.Fatalf("found only %d codes in errors.go: the parse is broken", len(declared))
	}
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(X_[A-Z_]+)` \\|").FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	for code := range declared {
		if !documented[code] {
			t.Errorf("%s is declared in frames/errors.go but has no row in docs/protocol.md §7", code)
		}
	}
	for code := range documented {
		if !declared[code] {
			t.Errorf("docs/protocol.md §7 has a row for %s, which frames/errors.go does not declare", code)
		}
	}
}
