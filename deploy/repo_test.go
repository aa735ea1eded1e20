package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxTrackedSize is the most a file tracked by git may weigh outside
// docs/img: a committed binary or data dump is caught here, not in a clone.
const maxTrackedSize = 1 << 20

// No file git tracks is over 1 MB, except the images of docs/img.
func TestNoLargeTrackedFiles(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed: cannot list the tracked files")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git work tree (no .git directory?): %v", err)
	}
	root := strings.TrimSpace(string(top))
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err)
	}
	files := bytes.Split(bytes.TrimRight(out, "\x00"), []byte{0})
	if len(files) < 10 {
		t.Skipf("git ls-files listed %d files: not this repository's work tree", len(files))
	}
	for _, f := range files {
		name := string(f)
		if strings.HasPrefix(name, "docs/img/") {
			continue
		}
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil {
			continue // deleted in the work tree, not yet in the index
		}
		if fi.Size() > maxTrackedSize {
			t.Errorf("%s is tracked by git and weighs %.1f MB (over 1 MB): remove it (git rm --cached) and ignore it in .gitignore if it is build output", name, float64(fi.Size())/(1<<20))
		}
	}
}
