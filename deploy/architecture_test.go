package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// docs/architecture.md names every package of the module in its tables,
// as `path`: a package added without a word there fails here.
func TestArchitectureNamesEveryPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}", "../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/quota-lease/quota-lease/"
	n := 0
	for _, path := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(path, module)
		if !ok {
			continue // the module's root package, if it had one
		}
		n++
		if !strings.Contains(string(doc), "`"+rel+"`") {
			t.Errorf("docs/architecture.md does not name package %s: add it to the table of parts", rel)
		}
	}
	if n < 20 {
		t.Fatalf("go list named %d packages: not this module", n)
	}
}
