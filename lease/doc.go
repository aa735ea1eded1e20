// Package lease defines what a grant is (share, burst, valid-for) and its
// state machine on both the coordinator and the agent side, with expiry
// computed on monotonic clocks. See ../shared/DESIGN.md invariants 6-8.
package lease
