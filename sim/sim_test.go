package sim

import (
	"os"
	"testing"
)

func TestQuick(t *testing.T) {
	s, err := Load("scenarios/follow-the-sun.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := RunToDir(s, t.TempDir(), os.Stdout)
	if err != nil {
		t.Fatal(err)
	}
	_ = res
}
