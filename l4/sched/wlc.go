package sched

import "fmt"

// WLC picks the member with the fewest active connections per unit of weight, as IPVS's
// weighted least-connection scheduler does: member i beats member j when
// conns[i]·weight[j] < conns[j]·weight[i], ties going to the member listed first. A pick
// costs O(members). WLC holds only its configuration, so Pick may be called from several
// goroutines as long as each passes its own counts.
type WLC struct {
	ids     []uint16
	weights []uint64
}

// NewWLC returns a least-connection scheduler over ids with the given weights; members of
// weight 0 are never picked. It copies the slices and panics if their lengths differ.
func NewWLC(ids []uint16, weights []uint32) *WLC {
	if len(ids) != len(weights) {
		panic(fmt.Sprintf("sched.NewWLC: %d ids but %d weights", len(ids), len(weights)))
	}
	w := &WLC{}
	for i, id := range ids {
		if weights[i] == 0 {
			continue
		}
		w.ids = append(w.ids, id)
		w.weights = append(w.weights, uint64(weights[i]))
	}
	return w
}

// Pick returns the member with the least conns[id]/weight. conns is indexed by member
// ID (the caller's own per-member connection counts, such as a connection table's
// MemberCounts); an ID beyond its end counts as 0 connections. ok is false when no member
// has a weight above zero.
func (w *WLC) Pick(conns []uint32) (id uint16, ok bool) {
	if len(w.ids) == 0 {
		return 0, false
	}
	best := 0
	bestConns := connsOf(conns, w.ids[0])
	weights := w.weights[:len(w.ids)]
	for i := 1; i < len(w.ids); i++ {
		c := connsOf(conns, w.ids[i])
		if c*weights[best] < bestConns*weights[i] {
			best, bestConns = i, c
		}
	}
	return w.ids[best], true
}

func connsOf(conns []uint32, id uint16) uint64 {
	if int(id) < len(conns) {
		return uint64(conns[id])
	}
	return 0
}
