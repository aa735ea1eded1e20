package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
)

// MaxPolicyFileBytes bounds a policy file, so a mistaken upload cannot
// exhaust memory.
const MaxPolicyFileBytes = 1 << 20

// ParsePolicies reads one or more policies from YAML, one per document
// (separated by "---"), normalizes and validates each, and refuses unknown
// fields and duplicate names. It returns every policy or an error; never a
// partial set.
func ParsePolicies(data []byte) ([]*Policy, error) {
	if len(data) > MaxPolicyFileBytes {
		return nil, fmt.Errorf("%w: file is %d bytes, more than %d", ErrInvalidPolicy, len(data), MaxPolicyFileBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var out []*Policy
	seen := map[string]bool{}
	for doc := 1; ; doc++ {
		var p Policy
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: document %d: %v", ErrInvalidPolicy, doc, err)
		}
		p.Normalize()
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("%w: document %d: policy %s is defined twice", ErrInvalidPolicy, doc, QuoteName(p.Name))
		}
		seen[p.Name] = true
		out = append(out, &p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no policy found; a file holds one or more YAML documents, each with name, "+
			"identity, limit and period", ErrInvalidPolicy)
	}
	return out, nil
}

// ParsePolicyFile reads a policy file in either format: quota-lease
// policies (ParsePolicies) or an envoyproxy/ratelimit configuration, one
// with a top-level domain (ParseEnvoyConfig).
func ParsePolicyFile(data []byte) ([]*Policy, error) {
	if IsEnvoyConfig(data) {
		return ParseEnvoyConfig(data)
	}
	return ParsePolicies(data)
}
