package envflag

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestApply(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cert := fs.String("tls-cert", "", "")
	timeout := fs.Duration("check-timeout", time.Second, "")
	region := fs.String("region", "", "")
	t.Setenv("QUOTALEASE_TLS_CERT", "/etc/c.pem")
	t.Setenv("QUOTALEASE_CHECK_TIMEOUT", "50ms")
	t.Setenv("QUOTALEASE_REGION", "eu")
	if err := Apply(fs); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"--region", "us"}); err != nil {
		t.Fatal(err)
	}
	if *cert != "/etc/c.pem" || *timeout != 50*time.Millisecond || *region != "us" {
		t.Fatalf("cert %q timeout %v region %q: want env values, and the command line to win", *cert, *timeout, *region)
	}
	t.Setenv("QUOTALEASE_CHECK_TIMEOUT", "soon")
	if err := Apply(fs); err == nil || !strings.Contains(err.Error(), "QUOTALEASE_CHECK_TIMEOUT") {
		t.Fatalf("bad value: %v", err)
	}
}

// A configuration file sets flags under the environment, which is under
// the command line; lists become comma-separated values.
func TestPresetFileEnvCommandLine(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(file, []byte("region: from-file\ncheck-timeout: 30ms\ncoordinator: [a:1, b:2]\nlog-json: true\nfraction: 0.25\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	region := fs.String("region", "", "")
	timeout := fs.Duration("check-timeout", time.Second, "")
	coord := fs.String("coordinator", "", "")
	js := fs.Bool("log-json", false, "")
	frac := fs.Float64("fraction", 0, "")
	level := fs.String("log-level", "info", "")
	AddConfigFlag(fs)
	t.Setenv("QUOTALEASE_CHECK_TIMEOUT", "40ms")
	t.Setenv("QUOTALEASE_LOG_LEVEL", "debug")
	args := []string{"--config", file, "--region", "us"}
	if err := Preset(fs, args); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if *region != "us" || *timeout != 40*time.Millisecond || *coord != "a:1,b:2" || !*js || *frac != 0.25 || *level != "debug" {
		t.Fatalf("region %q timeout %v coordinator %q json %v fraction %v level %q", *region, *timeout, *coord, *js, *frac, *level)
	}
	// --config=FILE and QUOTALEASE_CONFIG name it too.
	for _, args := range [][]string{{"--config=" + file}, {"-config", file}, nil} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		region := fs.String("region", "", "")
		fs.Duration("check-timeout", 0, "")
		fs.String("coordinator", "", "")
		fs.Bool("log-json", false, "")
		fs.Float64("fraction", 0, "")
		AddConfigFlag(fs)
		if args == nil {
			t.Setenv("QUOTALEASE_CONFIG", file)
		}
		if err := Preset(fs, args); err != nil || *region != "from-file" {
			t.Fatalf("%v: region %q, %v", args, *region, err)
		}
	}
}

// A file with a key that is no flag, a value a flag refuses, a mapping, or
// that cannot be read is an error naming the file and the key.
func TestPresetFileErrors(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"regoin: us\n":               `unknown setting "regoin"`,
		"check-timeout: soon\n":      "check-timeout",
		"region: {a: b}\n":           "region: a mapping",
		"- region\n":                 "not a YAML mapping",
		"region:\n":                  "region: no value",
		"config: other.yaml\n":       `unknown setting "config"`,
		"region: [[a]]\n":            "a list of lists",
		"check-timeout: 1s\n\t bad:": "not a YAML mapping",
	} {
		file := filepath.Join(dir, "c.yaml")
		os.WriteFile(file, []byte(body), 0o600)
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.String("region", "", "")
		fs.Duration("check-timeout", 0, "")
		AddConfigFlag(fs)
		err := Preset(fs, []string{"--config", file})
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), file) {
			t.Errorf("%q: %v, want an error naming %s and %q", body, err, file, want)
		}
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	AddConfigFlag(fs)
	if err := Preset(fs, []string{"--config", filepath.Join(dir, "missing.yaml")}); err == nil || !strings.Contains(err.Error(), "--config") {
		t.Errorf("missing file: %v", err)
	}
	empty := filepath.Join(dir, "empty.yaml")
	os.WriteFile(empty, nil, 0o600)
	if err := Preset(fs, []string{"--config", empty}); err != nil {
		t.Errorf("an empty file sets nothing, got %v", err)
	}
}
