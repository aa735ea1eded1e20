// Package bound computes the overshoot bound: from a policy and the
// deployment parameters, the worst-case total a set of regions can admit.
package bound
