package sched

import "fmt"

// WRR is nginx's smooth weighted round robin over member IDs: with weights 5, 1, 1 it
// yields a a b a c a a, spreading each member's turns evenly through the cycle instead of
// in runs. A pick costs O(members). WRR is not safe for concurrent use; build one per
// core from the same configuration.
type WRR struct {
	ids     []uint16
	weights []int64
	current []int64
	total   int64
}

// NewWRR returns a round robin over ids with the given weights; members of weight 0 are
// never picked. It copies the slices and panics if their lengths differ.
func NewWRR(ids []uint16, weights []uint32) *WRR {
	if len(ids) != len(weights) {
		panic(fmt.Sprintf("sched.NewWRR: %d ids but %d weights", len(ids), len(weights)))
	}
	w := &WRR{}
	for i, id := range ids {
		if weights[i] == 0 {
			continue
		}
		w.ids = append(w.ids, id)
		w.weights = append(w.weights, int64(weights[i]))
		w.total += int64(weights[i])
	}
	w.current = make([]int64, len(w.ids))
	return w
}

// Next returns the next member ID. ok is false when no member has a weight above zero.
func (w *WRR) Next() (id uint16, ok bool) {
	if len(w.ids) == 0 {
		return 0, false
	}
	best := 0
	cur := w.current[:len(w.weights)]
	for i, wt := range w.weights {
		cur[i] += wt
		if cur[i] > cur[best] {
			best = i
		}
	}
	cur[best] -= w.total
	return w.ids[best], true
}
