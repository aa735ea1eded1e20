package admission

import (
	"fmt"
	"sync/atomic"

	"github.com/quota-lease/quota-lease/policy"
)

// PolicySet is the set of policies in force, by name. It can be replaced
// while requests are decided; the zero value holds none. It is safe for
// concurrent use.
type PolicySet struct {
	m atomic.Pointer[map[string]*policy.Policy]
}

// Set validates ps and puts it in force atomically. On error the previous
// set stays in force.
func (s *PolicySet) Set(ps []*policy.Policy) error {
	m := make(map[string]*policy.Policy, len(ps))
	for _, p := range ps {
		if err := p.Validate(); err != nil {
			return err
		}
		if _, dup := m[p.Name]; dup {
			return fmt.Errorf("%w: policy %q is defined twice", policy.ErrInvalidPolicy, p.Name)
		}
		m[p.Name] = p
	}
	s.m.Store(&m)
	return nil
}

// Policy returns the policy called name.
func (s *PolicySet) Policy(name string) (*policy.Policy, bool) {
	m := s.m.Load()
	if m == nil {
		return nil, false
	}
	p, ok := (*m)[name]
	return p, ok
}
