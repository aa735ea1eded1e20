package envflag

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ConfigFlag is the flag naming a command's configuration file.
const ConfigFlag = "config"

// AddConfigFlag defines --config on fs, for Preset to read.
func AddConfigFlag(fs *flag.FlagSet) {
	fs.String(ConfigFlag, "", "YAML file of settings: each key a flag name without the dashes (log-level: "+
		"debug; a list for a comma-separated flag); the environment (QUOTALEASE_*) and the command line "+
		"override it (env QUOTALEASE_CONFIG)")
}

// Preset sets fs's flags, before the command line args are parsed over
// them, from the configuration file named by --config (in args) or
// QUOTALEASE_CONFIG, and then from the environment (Apply): the command
// line wins over the environment, which wins over the file. A file key
// that names no flag, a value a flag refuses, or an unreadable file is an
// error naming the file and the key.
func Preset(fs *flag.FlagSet, args []string) error {
	if path := configPath(args); path != "" {
		if err := ApplyFile(fs, path); err != nil {
			return err
		}
	}
	return Apply(fs)
}

// configPath finds --config's value on the command line, else in the
// environment.
func configPath(args []string) string {
	for i, a := range args {
		if a == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != ConfigFlag {
			continue
		}
		if hasVal {
			return val
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	return os.Getenv(Name(ConfigFlag))
}

// ApplyFile sets the flags of fs named in the YAML mapping in file.
func ApplyFile(fs *flag.FlagSet, file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var m map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&m); err != nil && !errors.Is(err, io.EOF) { // an empty file sets nothing
		return fmt.Errorf("--config %s: not a YAML mapping of flag names to values: %w", file, err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == ConfigFlag || fs.Lookup(k) == nil {
			return fmt.Errorf("--config %s: unknown setting %q (settings are the flag names without dashes; --help "+
				"lists them)", file, k)
		}
		v, err := settingValue(m[k])
		if err != nil {
			return fmt.Errorf("--config %s: %s: %w", file, k, err)
		}
		if err := fs.Set(k, v); err != nil {
			return fmt.Errorf("--config %s: %s: %q: %v", file, k, v, err)
		}
	}
	return nil
}

// settingValue is a YAML value as a flag's text: scalars as written, a
// list of scalars joined with commas.
func settingValue(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", errors.New("no value")
	case map[string]any:
		return "", errors.New("a mapping, want a value")
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			s, err := settingValue(e)
			if err != nil {
				return "", err
			}
			if _, nested := e.([]any); nested {
				return "", errors.New("a list of lists")
			}
			parts[i] = s
		}
		return strings.Join(parts, ","), nil
	default:
		return fmt.Sprint(x), nil
	}
}
