package console

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/clock"
)

// Config tunes a Console. Start from DefaultConfig and change what you
// need; New checks it with Validate.
type Config struct {
	// SampleEvery is how often the console records every quota's shares
	// and modes for its charts.
	SampleEvery time.Duration
	// Keep is how much history is kept in memory, about 40 bytes per
	// region and quota for every sample.
	Keep time.Duration
	// Refresh is how often an open page fetches itself again.
	Refresh time.Duration
	// ChartPoints is the most points a chart draws; longer histories are
	// summarised (the last share and the worst mode of each stretch).
	ChartPoints int
	// Clock timestamps the samples.
	Clock clock.Clock
	// Logger is told of failed samples.
	Logger hclog.Logger
}

// DefaultConfig samples every 5 s, keeps 3 h and refreshes pages every 5 s.
func DefaultConfig() Config {
	return Config{SampleEvery: 5 * time.Second, Keep: 3 * time.Hour, Refresh: 5 * time.Second, ChartPoints: 360,
		Clock: clock.System(), Logger: hclog.NewNullLogger()}
}

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	switch {
	case c.SampleEvery < 100*time.Millisecond:
		return fmt.Errorf("console sample interval %v: must be at least 100ms", c.SampleEvery)
	case c.Keep < c.SampleEvery:
		return fmt.Errorf("console history %v: must be at least one sample interval (%v)", c.Keep, c.SampleEvery)
	case c.Keep/c.SampleEvery > 1_000_000:
		return fmt.Errorf("console history %v at one sample every %v is more than a million samples: keep less "+
			"or sample less often", c.Keep, c.SampleEvery)
	case c.Refresh < 500*time.Millisecond:
		return fmt.Errorf("console refresh %v: must be at least 500ms", c.Refresh)
	case c.ChartPoints < 2:
		return fmt.Errorf("console chart points %d: must be at least 2", c.ChartPoints)
	case c.Clock == nil:
		return errors.New("console: no clock")
	case c.Logger == nil:
		return errors.New("console: no logger")
	}
	return nil
}
