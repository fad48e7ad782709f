package blacklist

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// GlobalName is the name of the global list, and its listener label in metrics.
const GlobalName = "global"

// Lists holds the global blacklist and one per listener. Lookups are lock-free; a
// listener's list is created on first use and lives as long as the Lists. A nil
// *Lists blocks nothing.
type Lists struct {
	opts   Options
	global *List
	mu     sync.Mutex // serializes creation
	byName atomic.Pointer[map[string]*List]
}

// NewLists returns a global list and no listener lists, all empty.
func NewLists(opts Options) *Lists {
	ls := &Lists{opts: opts, global: NewList(GlobalName, opts)}
	ls.byName.Store(&map[string]*List{})
	return ls
}

// Global returns the global list.
func (ls *Lists) Global() *List { return ls.global }

// Listener returns the list of a listener, creating it empty on first use. The name
// GlobalName returns the global list.
func (ls *Lists) Listener(name string) *List {
	if name == GlobalName {
		return ls.global
	}
	if l := (*ls.byName.Load())[name]; l != nil {
		return l
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	cur := *ls.byName.Load()
	if l := cur[name]; l != nil {
		return l
	}
	next := make(map[string]*List, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	l := NewList(name, ls.opts)
	next[name] = l
	ls.byName.Store(&next)
	return l
}

// Names returns the names of the listener lists, sorted.
func (ls *Lists) Names() []string {
	m := *ls.byName.Load()
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Lookup returns the list that blocks a on listener, the global list first, or nil.
func (ls *Lists) Lookup(listener string, a netip.Addr) *List {
	if ls == nil {
		return nil
	}
	if ls.global.Contains(a) {
		return ls.global
	}
	if l := (*ls.byName.Load())[listener]; l.Contains(a) {
		return l
	}
	return nil
}

// Blocked reports whether a is blocked on listener, checking the global list and
// then the listener's, and names the list that blocks it.
func (ls *Lists) Blocked(listener string, a netip.Addr) (listName string, blocked bool) {
	if l := ls.Lookup(listener, a); l != nil {
		return l.name, true
	}
	return "", false
}

// Check is Blocked that also counts the hit on the list that blocks, by source.
func (ls *Lists) Check(listener string, a netip.Addr, source string) (listName string, blocked bool) {
	if l := ls.Lookup(listener, a); l != nil {
		l.Hit(source)
		return l.name, true
	}
	return "", false
}
