package ratelimitxds

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/quota-lease/quota-lease/policy"
)

// TypeURL is the type of the resources subscribed to: envoyproxy/
// ratelimit's configuration, one domain per resource.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// MaxPolicies bounds the policies one response may become. The coordinator
// keeps a book per policy and writes each to etcd; a response past it is
// rejected whole.
const MaxPolicies = 2000

// Config is one response's resources as policies: every policy of every
// RateLimitConfig, each with the name of the resource it came from.
type Config struct {
	// Version is the response's version_info.
	Version string
	// Policies, sorted by name.
	Policies []*policy.Policy
	// Resource names the RateLimitConfig each policy came from, by policy
	// name.
	Resource map[string]string
}

// Convert maps a response's resources onto policies, as envoyproxy/
// ratelimit loads them (src/config/config_xds.go, then its loader): each
// RateLimitConfig is its configuration file, converted by the one
// conversion files go through (policy.EnvoyConfig.Policies). As in the
// original with its default MERGE_DOMAIN_CONFIG=false, two resources of one
// domain are refused. Two resources whose limits map to one policy name are
// refused too: a name is one policy. Every policy or an error that says
// which resource and why; no response is half converted.
func Convert(version string, resources []*anypb.Any) (Config, error) {
	c := Config{Version: version, Resource: map[string]string{}}
	domains := map[string]string{}
	for i, res := range resources {
		if res.GetTypeUrl() != TypeURL {
			return Config{}, fmt.Errorf("resource %d has type %s; only %s is served here",
				i, policy.QuoteName(res.GetTypeUrl()), TypeURL)
		}
		var rc rlsconf.RateLimitConfig
		if err := anypb.UnmarshalTo(res, &rc, proto.UnmarshalOptions{}); err != nil {
			return Config{}, fmt.Errorf("resource %d: %w", i, err)
		}
		name := rc.GetName()
		if name == "" {
			name = fmt.Sprintf("#%d", i)
		}
		if prev, dup := domains[rc.GetDomain()]; dup && rc.GetDomain() != "" {
			return Config{}, fmt.Errorf("resources %s and %s both configure domain %s; one resource per domain",
				policy.QuoteName(prev), policy.QuoteName(name), policy.QuoteName(rc.GetDomain()))
		}
		domains[rc.GetDomain()] = name
		ps, err := envoyConfig(&rc).Policies()
		if err != nil {
			return Config{}, fmt.Errorf("resource %s: %w", policy.QuoteName(name), err)
		}
		for _, p := range ps {
			if other, dup := c.Resource[p.Name]; dup {
				return Config{}, fmt.Errorf("resources %s and %s both have a limit that maps to policy %s; name one "+
					"differently with rate_limit.name", policy.QuoteName(other), policy.QuoteName(name), policy.QuoteName(p.Name))
			}
			c.Resource[p.Name] = name
			c.Policies = append(c.Policies, p)
		}
		if len(c.Policies) > MaxPolicies {
			return Config{}, fmt.Errorf("the resources map to more than %d policies", MaxPolicies)
		}
	}
	sort.Slice(c.Policies, func(i, j int) bool { return c.Policies[i].Name < c.Policies[j].Name })
	return c, nil
}

// envoyConfig is rc in the form its configuration file has, field for
// field, as envoyproxy/ratelimit's ConfigXdsProtoToYaml makes it: the
// unit's enum name is the file's unit (SECOND is second; UNKNOWN is no
// unit, which the conversion refuses unless the limit is unlimited).
func envoyConfig(rc *rlsconf.RateLimitConfig) policy.EnvoyConfig {
	return policy.EnvoyConfig{Domain: rc.GetDomain(), Descriptors: envoyDescriptors(rc.GetDescriptors())}
}

func envoyDescriptors(ds []*rlsconf.RateLimitDescriptor) []policy.EnvoyDescriptor {
	if len(ds) == 0 {
		return nil
	}
	out := make([]policy.EnvoyDescriptor, len(ds))
	for i, d := range ds {
		out[i] = policy.EnvoyDescriptor{
			Key:            d.GetKey(),
			Value:          d.GetValue(),
			Descriptors:    envoyDescriptors(d.GetDescriptors()),
			ShadowMode:     d.GetShadowMode(),
			DetailedMetric: d.GetDetailedMetric(),
		}
		if rl := d.GetRateLimit(); rl != nil {
			out[i].RateLimit = &policy.EnvoyRateLimit{
				Unit:            strings.ToLower(rl.GetUnit().String()),
				RequestsPerUnit: rl.GetRequestsPerUnit(),
				Unlimited:       rl.GetUnlimited(),
				Name:            rl.GetName(),
			}
			for _, r := range rl.GetReplaces() {
				out[i].RateLimit.Replaces = append(out[i].RateLimit.Replaces, policy.EnvoyReplace{Name: r.GetName()})
			}
		}
	}
	return out
}

// Rejection is an error of a response that cannot be applied as it is:
// the client NACKs it with the error as its detail, and waits for another.
// Any other error of applying one is taken as passing (etcd unreachable,
// leadership lost): the client reconnects and is sent the whole state again.
type Rejection struct{ Err error }

func (r *Rejection) Error() string { return r.Err.Error() }
func (r *Rejection) Unwrap() error { return r.Err }

// Reject marks err as a Rejection.
func Reject(err error) error { return &Rejection{Err: err} }

// IsRejection reports whether err is a Rejection.
func IsRejection(err error) bool {
	var r *Rejection
	return errors.As(err, &r)
}
