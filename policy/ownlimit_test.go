package policy

import (
	"errors"
	"testing"
	"time"
)

// An own limit counts in its policy's counter when the policy is a fixed
// window of the same period (envoyproxy/ratelimit's override shares the
// configured limit's cache key then), in a counter of its own otherwise;
// either way it is a region-scoped fixed window, not in shadow mode and
// tied to no Envoy descriptor.
func TestUnderOwnLimit(t *testing.T) {
	p := &Policy{Name: "d.user", Identity: []string{"user"}, Algorithm: FixedWindow, Limit: 10, Period: Duration(time.Hour),
		ShadowMode: true, Envoy: &EnvoyMatch{Domain: "d", Name: "n", QuotaMode: true}, Version: 3}
	same := p.UnderOwnLimit(OwnLimit{Limit: 2, Period: Duration(time.Hour)})
	if same.Name != "d.user" || same.Version != 3 || same.Limit != 2 || same.Scope != ScopeRegion || same.ShadowMode || same.Envoy != nil {
		t.Fatalf("same unit: %+v, want d.user's counter at 2 per hour, region scope, no shadow, no Envoy match", same)
	}
	if same.EnvoyLimitName() != "" || p.Limit != 10 || !p.ShadowMode {
		t.Fatalf("the override has a name (%q), or changed its policy (%+v)", same.EnvoyLimitName(), p)
	}
	other := p.UnderOwnLimit(OwnLimit{Limit: 2, Period: Duration(time.Minute)})
	tb := &Policy{Name: "tb", Identity: []string{"user"}, Algorithm: TokenBucket, Limit: 10, Period: Duration(time.Minute)}
	if other.Name != "d.user~1m0s" || tb.UnderOwnLimit(OwnLimit{Limit: 1, Period: Duration(time.Minute)}).Name != "tb~1m0s" {
		t.Fatalf("another unit or algorithm: %q, want a counter of its own", other.Name)
	}
	if err := other.Limits().Validate(); err != nil {
		t.Fatalf("limits of %+v: %v", other, err)
	}
}

func TestOwnLimitValidate(t *testing.T) {
	for _, o := range []OwnLimit{{Limit: 0, Period: Duration(time.Second)}, {Limit: MaxCapacity / Micro, Period: Duration(24 * time.Hour)},
		{Limit: MaxCapacity/Micro + 1, Period: Duration(time.Second)}} {
		if err := o.Validate(); err != nil {
			t.Errorf("%+v: %v, want valid", o, err)
		}
	}
	// Above the most a limit can count, practically unlimited: the most.
	huge := (&Policy{Name: "p", Algorithm: FixedWindow, Limit: 1, Period: Duration(time.Second)}).UnderOwnLimit(OwnLimit{Limit: 1 << 40, Period: Duration(time.Second)})
	if err := huge.Limits().Validate(); err != nil || huge.Limits().Capacity != MaxCapacity/Micro*Micro {
		t.Errorf("a huge own limit: %+v, %v; want MaxCapacity", huge.Limits(), err)
	}
	for _, o := range []OwnLimit{{Limit: 1}, {Limit: 1, Period: Duration(7 * 24 * time.Hour)}, {Limit: 1, Period: Duration(time.Microsecond)},
		{Limit: -1, Period: Duration(time.Second)}} {
		if err := o.Validate(); !errors.Is(err, ErrInvalidOwnLimit) {
			t.Errorf("%+v: %v, want ErrInvalidOwnLimit", o, err)
		}
	}
}
