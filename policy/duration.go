package policy

import (
	"encoding/json"
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written in configuration as a Go duration
// string ("500ms", "1m"). A bare number is refused: "60" could mean seconds
// or nanoseconds, and a rate limit must not guess.
type Duration time.Duration

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML parses a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return fmt.Errorf("line %d: duration must be a string with a unit, such as \"1s\" or \"1m\", got %s",
			n.Line, QuoteName(n.Value))
	}
	return d.parse(n.Value)
}

// MarshalYAML writes the duration string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// UnmarshalJSON parses a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string with a unit, such as \"1s\", got %s", b)
	}
	return d.parse(s)
}

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

func (d *Duration) parse(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		// ParseDuration's error quotes s whole: name it once, cut.
		return fmt.Errorf("duration %s: not a number with a unit, such as \"1s\" or \"1m\"", QuoteName(s))
	}
	*d = Duration(v)
	return nil
}
