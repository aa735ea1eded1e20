package edge

import (
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// Resize, Refresh and Pushed let tests outside the package (which may import
// edge/envoy) size a slot's buckets as Key.Push does.
func (s *Slot) Resize(now time.Time, p *policy.Policy, share int64, cfg Config) {
	s.resize(now, p, share, cfg)
}

func (s *Slot) Pushed(from, end time.Time) { s.pushed(from, end) }

func (s *Slot) Refresh(now time.Time, p *policy.Policy, share int64, cfg Config) bool {
	return s.refresh(now, p, share, cfg)
}

// NewView is the view read at readAt of the other agents' holdings others
// and this agent's reservations own (the rounds make theirs in setView).
func NewView(readAt time.Time, others map[ID]Others, own map[ID]int64) *View {
	return &View{ReadAt: readAt, others: others, own: ownedView{base: own}}
}
