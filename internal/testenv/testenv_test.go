package testenv

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const importPath = "github.com/quota-lease/quota-lease/internal/testenv"

// Only tests import testenv: no product code depends on test support.
func TestOnlyTestsImport(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == importPath {
				t.Errorf("%s imports testenv; only _test.go files may", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestWaitFor(t *testing.T) {
	n := 0
	WaitFor(t, 5*time.Second, "the third call", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("condition called %d times, want 3", n)
	}
}

func TestPrefixUnique(t *testing.T) {
	if a, b := Prefix(t), Prefix(t); a == b || !strings.HasPrefix(a, "/test/TestPrefixUnique/") {
		t.Fatalf("prefixes %q, %q: want distinct, under /test/TestPrefixUnique/", a, b)
	}
}

func TestMustPolicy(t *testing.T) {
	p := MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 10\nperiod: 1s\n")
	if p.Name != "api" {
		t.Fatalf("name %q, want api", p.Name)
	}
	if ps := MustPolicies(t, "{name: a, identity: [tenant], limit: 1, period: 1s}\n---\n{name: b, identity: [tenant], limit: 1, period: 1s}\n"); len(ps) != 2 {
		t.Fatalf("%d policies, want 2", len(ps))
	}
}
