package agent

import (
	"math/rand/v2"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricsRegistry is the agent's Prometheus registry.
type MetricsRegistry = prometheus.Registry

func randFloat() float64 { return rand.Float64() }
