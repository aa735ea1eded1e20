package agent

import (
	"strings"

	"github.com/hashicorp/go-hclog"
)

// refusals gathers the quotas one lease answer refused, by error (its text
// without the quota's name), so that
// they are logged as one line per distinct error with how many quotas and
// which (the first few): after an outage every policy's grant is stale at
// once, and a line per policy was a hundred lines saying one thing.
type refusals struct {
	errs  []string            // distinct error texts, in order of first use
	names map[string][]string // error text -> quotas
}

// refusalNamesLogged is how many quota names a refusal line lists.
const refusalNamesLogged = 5

func (r *refusals) add(quota string, err error) {
	if r.names == nil {
		r.names = map[string][]string{}
	}
	text := strings.TrimPrefix(err.Error(), "quota "+quota+": ") // the refusals' form (leaseapi)
	if _, ok := r.names[text]; !ok {
		r.errs = append(r.errs, text)
	}
	r.names[text] = append(r.names[text], quota)
}

// log writes one warning per distinct error.
func (r *refusals) log(log hclog.Logger) {
	for _, text := range r.errs {
		names := r.names[text]
		shown := names[:min(len(names), refusalNamesLogged)]
		log.Warn("leases refused", "quotas", len(names), "policies", shown, "error", text)
	}
}
