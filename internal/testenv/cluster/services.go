package cluster

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv/faultproxy"
)

// StartServices starts n limited-service processes in region, limiting
// the tenants of policy (served at the edge in domain "shop") and
// reporting every report, over mutual TLS as a service; each lists the
// region's first agent, through its proxy.
func (c *Cluster) StartServices(
	ctx context.Context,
	region, policy string,
	n int,
	report time.Duration,
) ([]*ServiceProcess, error) {
	agents := c.RegionAgents(region)
	if len(agents) == 0 {
		return nil, fmt.Errorf("services of %s: the region has no agent", region)
	}
	var out []*ServiceProcess
	for i := range n {
		px, err := faultproxy.Start(agents[0].Addr)
		if err != nil {
			return nil, err
		}
		sv := &ServiceProcess{Region: region, Proxy: px}
		var listen string
		name := fmt.Sprintf("service-%s-%d", region, i+1)
		sv.Process, err = c.startServing(ctx, name, c.bins.Service, func() ([]string, error) {
			listen, _ = c.freeAddr()
			return []string{"--listen", listen, "--agents", px.Addr, "--domain", "shop", "--policy", policy,
				"--report-interval", report.String(), "--tls-ca", c.pki.ca.CertFile,
				"--tls-cert", c.pki.service.Cert, "--tls-key", c.pki.service.Key}, nil
		})
		if err != nil {
			px.Close()
			return nil, err
		}
		sv.URL = "http://" + listen + "/"
		c.Services = append(c.Services, sv)
		out = append(out, sv)
	}
	return out, nil
}

// ServiceDriver sends one tenant's requests to limited-service processes
// and records, from each answer, what the services admitted (200) and
// refused (429).
type ServiceDriver struct {
	Policy, Tenant string

	mu         sync.Mutex
	admissions []Admission
	refused    int
	failed     int
}

// Run sends rate requests a second to each of services until ctx ends or
// dur passes.
func (d *ServiceDriver) Run(ctx context.Context, dur time.Duration, rate float64, services ...*ServiceProcess) {
	ctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	var wg sync.WaitGroup
	for _, sv := range services {
		wg.Add(1)
		go func() { defer wg.Done(); d.send(ctx, rate, sv) }()
	}
	wg.Wait()
}

// send sends rate requests a second to sv, one at a time, evenly spaced.
func (d *ServiceDriver) send(ctx context.Context, rate float64, sv *ServiceProcess) {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	every := time.Duration(float64(time.Second) / rate)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			d.one(ctx, client, sv)
		}
	}
}

// one sends one request and records its answer.
func (d *ServiceDriver) one(ctx context.Context, client *http.Client, sv *ServiceProcess) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, sv.URL, nil)
	if err != nil {
		return
	}
	req.Header.Set("X-Tenant", d.Tenant)
	at := time.Now()
	resp, err := client.Do(req)
	took := time.Since(at)
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case err != nil:
		if ctx.Err() == nil {
			d.failed++
		}
	case resp.StatusCode == http.StatusOK:
		d.admissions = append(d.admissions, Admission{At: at, Region: sv.Region, Policy: d.Policy, Identity: d.Tenant,
			Mode: "library", Took: took})
	case resp.StatusCode == http.StatusTooManyRequests:
		d.refused++
	default:
		d.failed++
	}
	if resp != nil {
		resp.Body.Close()
	}
}

// Admissions are what the services admitted, by the driver's records.
func (d *ServiceDriver) Admissions() []Admission {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Admission(nil), d.admissions...)
}

// Counts are how many requests the services admitted and refused.
func (d *ServiceDriver) Counts() (admitted, refused int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.admissions), d.refused
}

// Describe sums up the answers.
func (d *ServiceDriver) Describe() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return strings.Join([]string{fmt.Sprint(len(d.admissions), " admitted"), fmt.Sprint(d.refused, " refused"),
		fmt.Sprint(d.failed, " failed")}, ", ")
}
