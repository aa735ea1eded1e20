// Package envflag lets every flag of a command be set from the
// environment (--tls-cert from QUOTALEASE_TLS_CERT, and so on, as container
// platforms prefer) and from a YAML configuration file (--config), as
// systemd units and config management prefer. The command line wins over
// the environment, which wins over the file (Settings).
package envflag

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// Name is the environment variable of flag name: QUOTALEASE_ and the name
// in upper case with '-' as '_'.
func Name(flagName string) string {
	return "QUOTALEASE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Apply sets every flag of fs whose variable is set in the environment,
// before fs.Parse so that the command line overrides it. A value the flag
// refuses is an error naming the variable.
func Apply(fs *flag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil {
			return
		}
		if v, ok := os.LookupEnv(Name(f.Name)); ok && v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %v", Name(f.Name), v, e)
			}
		}
	})
	return err
}
