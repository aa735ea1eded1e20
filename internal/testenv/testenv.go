package testenv

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

// SkipMultiProcess skips t under -short: for a test that starts a whole
// deployment of real processes (or a browser) and runs for many seconds.
func SkipMultiProcess(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process suite; skipped with -short")
	}
}

// SkipSlow skips t under -short, saying why it is slow: for a test that
// restarts real processes or builds binaries for many seconds.
func SkipSlow(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip(why + "; skipped with -short")
	}
}

// ShortMain is for the TestMain of a package whose every test starts real
// processes: under -short it runs the tests (which skip themselves with
// SkipMultiProcess) without the setup, so the package costs nothing;
// otherwise it runs setup, the tests, then teardown. setup returns the
// teardown, or an error that fails the package. It returns the exit code
// for os.Exit.
func ShortMain(m *testing.M, setup func() (teardown func(), err error)) int {
	flag.Parse() // testing.Short needs the flags, which m.Run would parse later
	if testing.Short() {
		return m.Run()
	}
	teardown, err := setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer teardown()
	return m.Run()
}
