package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/quota-lease/quota-lease/internal/testenv/rlqsenvoy"
)

// docBlock is a fenced YAML block of a Markdown file and its tag (the
// word after the language: ```yaml rlqs-filter).
type docBlock struct {
	tag, body string
	line      int
}

func yamlBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	re := regexp.MustCompile("(?ms)^```yaml([^\n]*)\n(.*?)^```")
	var out []docBlock
	for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
		out = append(out, docBlock{tag: strings.TrimSpace(text[m[2]:m[3]]), body: text[m[4]:m[5]],
			line: strings.Count(text[:m[0]], "\n") + 1})
	}
	return out
}

// parseYAML reads YAML into m the way Envoy reads its configuration:
// YAML to JSON, then protojson, which refuses unknown fields and
// resolves every Any by its @type.
func parseYAML(yml string, m proto.Message) error {
	var v any
	if err := yaml.Unmarshal([]byte(yml), &v); err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	js, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("to json: %w", err)
	}
	return protojson.Unmarshal(js, m)
}

type validator interface{ ValidateAll() error }

// validateDeep runs m's validation and that of every message packed in an
// Any within it, at any depth: the generated Validate does not look inside
// an Any (a filter's matcher actions, its inputs).
func validateDeep(m proto.Message) error {
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	var err error
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		err = validateValue(fd, v)
		return err == nil
	})
	return err
}

func validateValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch {
	case fd.IsList():
		for i := range v.List().Len() {
			if err := validateValue1(fd, v.List().Get(i)); err != nil {
				return err
			}
		}
	case fd.IsMap():
		var err error
		v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
			err = validateValue1(fd.MapValue(), mv)
			return err == nil
		})
		return err
	default:
		return validateValue1(fd, v)
	}
	return nil
}

func validateValue1(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
		return nil
	}
	m := v.Message().Interface()
	if a, ok := m.(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s: %w", a.GetTypeUrl(), err)
		}
		return validateDeep(inner)
	}
	var err error
	v.Message().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		err = validateValue(fd, v)
		return err == nil
	})
	return err
}

// forEachAction calls f with every action of a matcher tree.
func forEachAction(m *xdsmatcherv3.Matcher, f func(*anypb.Any) error) error {
	var onMatch func(*xdsmatcherv3.Matcher_OnMatch) error
	onMatch = func(om *xdsmatcherv3.Matcher_OnMatch) error {
		if om == nil {
			return nil
		}
		if a := om.GetAction(); a != nil {
			return f(a.GetTypedConfig())
		}
		return forEachAction(om.GetMatcher(), f)
	}
	if m == nil {
		return nil
	}
	for _, mm := range m.GetMatcherList().GetMatchers() {
		if err := onMatch(mm.GetOnMatch()); err != nil {
			return err
		}
	}
	for _, om := range m.GetMatcherTree().GetExactMatchMap().GetMap() {
		if err := onMatch(om); err != nil {
			return err
		}
	}
	for _, om := range m.GetMatcherTree().GetPrefixMatchMap().GetMap() {
		if err := onMatch(om); err != nil {
			return err
		}
	}
	return onMatch(m.GetOnNoMatch())
}

// checkFilter validates a rate_limit_quota filter configuration whole:
// the configuration, every message inside it, and each bucket's settings
// as the Envoy-like test client takes them (which refuses what makes
// Envoy crash).
func checkFilter(cfg *rlqfv3.RateLimitQuotaFilterConfig) error {
	if err := validateDeep(cfg); err != nil {
		return err
	}
	if cfg.GetBucketMatchers() == nil {
		return fmt.Errorf("no bucket_matchers: Envoy would let every request through, unreported")
	}
	actions := 0
	err := forEachAction(cfg.GetBucketMatchers(), func(a *anypb.Any) error {
		s := &rlqfv3.RateLimitQuotaBucketSettings{}
		if err := a.UnmarshalTo(s); err != nil {
			return fmt.Errorf("a matcher action is not RateLimitQuotaBucketSettings: %w", err)
		}
		actions++
		return rlqsenvoy.ValidateSettings(s)
	})
	if err == nil && actions == 0 {
		err = fmt.Errorf("no matcher action")
	}
	return err
}

// withSettings returns cfg with every bucket's failure-mode settings
// replaced by fragment's.
func withSettings(cfg *rlqfv3.RateLimitQuotaFilterConfig, fragment *rlqfv3.RateLimitQuotaBucketSettings) (*rlqfv3.RateLimitQuotaFilterConfig, error) {
	out := proto.Clone(cfg).(*rlqfv3.RateLimitQuotaFilterConfig)
	err := forEachAction(out.GetBucketMatchers(), func(a *anypb.Any) error {
		s := &rlqfv3.RateLimitQuotaBucketSettings{}
		if err := a.UnmarshalTo(s); err != nil {
			return err
		}
		s.NoAssignmentBehavior, s.ExpiredAssignmentBehavior = nil, nil
		proto.Merge(s, fragment)
		return a.MarshalFrom(s)
	})
	return out, err
}

// Every Envoy configuration in docs/rlqs.md parses into go-control-plane's
// types and passes their validation: filters (as the http_filters entry
// users paste) into RateLimitQuotaFilterConfig, clusters into Cluster, and
// each failure mode's bucket settings in place of a documented filter's.
// An untagged YAML block fails the test, so none goes unchecked.
func TestRLQSDocConfigs(t *testing.T) {
	path := filepath.Join("..", "docs", "rlqs.md")
	var (
		filters   []*rlqfv3.RateLimitQuotaFilterConfig
		fragments []docBlock
		clusters  int
	)
	for _, b := range yamlBlocks(t, path) {
		where := fmt.Sprintf("%s:%d (%s)", path, b.line, b.tag)
		switch b.tag {
		case "rlqs-filter":
			hf := &hcmv3.HttpFilter{}
			if err := parseYAML(b.body, hf); err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			cfg := &rlqfv3.RateLimitQuotaFilterConfig{}
			if hf.GetName() != "envoy.filters.http.rate_limit_quota" {
				t.Errorf("%s: filter name %q", where, hf.GetName())
			}
			if err := hf.GetTypedConfig().UnmarshalTo(cfg); err != nil {
				t.Errorf("%s: typed_config is not a RateLimitQuotaFilterConfig: %v", where, err)
				continue
			}
			if err := checkFilter(cfg); err != nil {
				t.Errorf("%s: %v", where, err)
			}
			filters = append(filters, cfg)
		case "rlqs-cluster":
			c := &clusterv3.Cluster{}
			if err := parseYAML(b.body, c); err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			if err := validateDeep(c); err != nil {
				t.Errorf("%s: %v", where, err)
			}
			clusters++
		case "rlqs-bucket-settings":
			fragments = append(fragments, b)
		default:
			t.Errorf("%s: a yaml block tagged %q: tag it rlqs-filter, rlqs-cluster or rlqs-bucket-settings so that this test checks it", where, b.tag)
		}
	}
	if len(filters) == 0 || clusters == 0 || len(fragments) == 0 {
		t.Fatalf("found %d filters, %d clusters, %d bucket settings in %s: the tags or the page changed", len(filters), clusters, len(fragments), path)
	}
	for _, b := range fragments {
		where := fmt.Sprintf("%s:%d (%s)", path, b.line, b.tag)
		s := &rlqfv3.RateLimitQuotaBucketSettings{}
		if err := parseYAML(b.body, s); err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		cfg, err := withSettings(filters[0], s)
		if err == nil {
			err = checkFilter(cfg)
		}
		if err != nil {
			t.Errorf("%s: in the first filter's buckets: %v", where, err)
		}
	}
}

// The check refuses what it must: a typo'd field, a missing required
// field inside a matcher action, a token bucket as no_assignment_behavior.
func TestRLQSDocCheckRefuses(t *testing.T) {
	blocks := yamlBlocks(t, filepath.Join("..", "docs", "rlqs.md"))
	var good string
	for _, b := range blocks {
		if b.tag == "rlqs-filter" {
			good = b.body
			break
		}
	}
	if good == "" {
		t.Fatal("no rlqs-filter block")
	}
	cases := map[string]string{
		"unknown field":       strings.Replace(good, "domain: api", "domian: api", 1),
		"reporting_interval":  strings.Replace(good, "reporting_interval: 5s", "reporting_interval: 0.05s", 1),
		"token bucket before": strings.Replace(good, "fallback_rate_limit: {blanket_rule: DENY_ALL}", "fallback_rate_limit: {token_bucket: {max_tokens: 1, fill_interval: 1s}}", 1),
	}
	for name, body := range cases {
		if body == good {
			t.Fatalf("%s: the replacement did not apply; the page changed", name)
		}
		hf := &hcmv3.HttpFilter{}
		err := parseYAML(body, hf)
		if err == nil {
			cfg := &rlqfv3.RateLimitQuotaFilterConfig{}
			if err = hf.GetTypedConfig().UnmarshalTo(cfg); err == nil {
				err = checkFilter(cfg)
			}
		}
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
