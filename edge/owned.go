package edge

import "maps"

// owned is this agent's reservations as written (Key.Written), kept so
// that each view gets them without a copy of every identity's at every
// sync: a view shares base, which nothing changes once shared, and a
// copy of the changes since it (0: none held), a few identities a sync.
// The base is made anew once the changes outgrow a quarter of it.
type owned struct {
	base, changes map[ID]int64
	shared        bool // changes is a view's too: copied before the next change
}

// ownedView is this agent's reservations as a view holds them: neither
// map is changed after.
type ownedView struct{ base, changes map[ID]int64 }

// get is the reservation of id, 0 for none.
func (o ownedView) get(id ID) int64 {
	if v, ok := o.changes[id]; ok {
		return v
	}
	return o.base[id]
}

// ids calls f with every identity that may hold a reservation, some twice.
func (o ownedView) ids(f func(ID) bool) bool {
	for id := range o.base {
		if f(id) {
			return true
		}
	}
	for id := range o.changes {
		if f(id) {
			return true
		}
	}
	return false
}

// set notes id's reservation as written: v, none when v <= 0.
func (o *owned) set(id ID, v int64) {
	v = max(0, v)
	if (ownedView{o.base, o.changes}).get(id) == v {
		return
	}
	if o.shared || o.changes == nil {
		o.changes, o.shared = maps.Clone(o.changes), false
		if o.changes == nil {
			o.changes = map[ID]int64{}
		}
	}
	o.changes[id] = v
}

// view is the reservations now, for a view: what it holds no one changes.
func (o *owned) view() ownedView {
	if len(o.changes) > len(o.base)/4+8 {
		base := maps.Clone(o.base)
		if base == nil {
			base = map[ID]int64{}
		}
		for id, v := range o.changes {
			if v > 0 {
				base[id] = v
			} else {
				delete(base, id)
			}
		}
		o.base, o.changes, o.shared = base, nil, false
	}
	o.shared = true
	return ownedView{o.base, o.changes}
}
