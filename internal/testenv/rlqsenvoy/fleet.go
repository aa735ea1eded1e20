package rlqsenvoy

import (
	"context"
	"errors"
	"fmt"
)

// Fleet is many Envoy instances in one process, each with its own
// connection and stream.
type Fleet struct {
	Instances []*Instance
}

// NewFleet starts n instances, the i-th configured by config(i). If one
// fails to start, those already started are closed.
func NewFleet(ctx context.Context, n int, config func(i int) Config) (*Fleet, error) {
	f := &Fleet{}
	for i := range n {
		in, err := New(ctx, config(i))
		if err != nil {
			return nil, errors.Join(fmt.Errorf("fleet: instance %d: %w", i, err), f.Close())
		}
		f.Instances = append(f.Instances, in)
	}
	return f, nil
}

// Close closes every instance.
func (f *Fleet) Close() error {
	var errs []error
	for _, in := range f.Instances {
		errs = append(errs, in.Close())
	}
	return errors.Join(errs...)
}

// Stats are the instances' counters summed.
func (f *Fleet) Stats() Stats {
	var s Stats
	for _, in := range f.Instances {
		s.Add(in.Stats())
	}
	return s
}

// Records are every instance's records, instance by instance.
func (f *Fleet) Records() []BucketRecord {
	var out []BucketRecord
	for _, in := range f.Instances {
		out = append(out, in.Records()...)
	}
	return out
}
