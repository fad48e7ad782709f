package conntrack

// SYN proxy state (l4/synproxy, the datapath's SYN proxy) lives in a side array,
// parallel to the entries and allocated only when the proxy is enabled
// (EnableProxy), so that the 40-byte entry, and a table without the proxy, stay as
// they are. An entry whose Proxy has Flags 0 is not proxied.
//
// A proxied connection is inserted, once the client's cookie ACK checks, half-open
// (StateSynRecv, in the half-open FIFO: evicted first when the table is full, expired
// after syn_recv) with ProxyPending: the LD has sent its member the SYN and waits for
// the SYN-ACK. EstablishProxy moves it to StateEstablished when the member's SYN-ACK
// comes; from then on every packet is translated with its deltas.

// Proxy flags.
const (
	// ProxyOn marks a proxied connection.
	ProxyOn = 1 << 0
	// ProxyPending: the member's SYN-ACK has not come yet. SeqDelta then holds the
	// cookie (the LD's ISN), TSDelta the LD's TSval and Win the client's window.
	ProxyPending = 1 << 1
	// ProxyTS: the client and the LD use timestamps.
	ProxyTS = 1 << 2
	// ProxyWScale: the client and the LD use window scaling.
	ProxyWScale = 1 << 3
	// ProxySACK: the client offered SACK.
	ProxySACK = 1 << 4
)

// Proxy is a proxied connection's translation state. 12 bytes.
type Proxy struct {
	// SeqDelta is the member's ISN less the LD's (the cookie): the member's
	// sequence numbers are this much above what the client sees.
	SeqDelta uint32
	// TSDelta is the LD's TSval in its SYN-ACK less the member's: what is added to
	// the member's TSvals for the client.
	TSDelta uint32
	// Win is the client's window (pending only).
	Win uint16
	// Flags are ProxyOn, ProxyPending, ProxyTS, ProxyWScale, ProxySACK.
	Flags uint8
	// WShift is the member's window scale less the LD's: the member's windows are
	// shifted by this much for the client.
	WShift int8
}

// MaxWShift bounds Proxy.WShift: window scales are 0 to 14.
const MaxWShift = 14

// Ref is an entry found by a lookup, for Proxy and EstablishProxy; valid until the
// table is next changed. 0 is none.
type Ref uint32

// EnableProxy allocates the side array of proxy state, if it is not there: 12 bytes
// per entry. Call it on the goroutine that owns the table.
func (t *Table) EnableProxy() {
	if t.proxy == nil {
		t.proxy = make([]Proxy, len(t.entries))
	}
}

// ProxyEnabled reports whether EnableProxy was called.
func (t *Table) ProxyEnabled() bool { return t.proxy != nil }

// Proxy returns the proxy state of the entry ref, or nil when the entry is not
// proxied (or the proxy is not enabled).
func (t *Table) Proxy(ref Ref) *Proxy {
	if t.proxy == nil || ref == 0 || t.proxy[ref].Flags == 0 {
		return nil
	}
	return &t.proxy[ref]
}

// LookupTCPRef is LookupTCP, and also returns the entry found, for Proxy. A packet of
// a connection waiting for its member (ProxyPending) changes nothing but a reset,
// which closes it.
func (t *Table) LookupTCPRef(k *Key, hash uint64, flags uint8, now uint32) (member uint16, ref Ref, ok bool) {
	member, i, ok := t.lookupTCP(k, hash, flags, now)
	return member, Ref(i), ok
}

// LookupReplyRef is LookupReply for a TCP reply (confirmed StateEstablished), and
// also returns the entry found, for Proxy and EstablishProxy.
func (t *Table) LookupReplyRef(k *Key, hash uint64, now uint32) (member uint16, ref Ref, ok bool) {
	member, i, ok := t.lookupReply(k, hash, StateEstablished, now)
	return member, Ref(i), ok
}

// InsertProxy inserts a proxied connection waiting for its member: as Insert in
// StateSynRecv, with proxy state px (ProxyOn and ProxyPending are set).
func (t *Table) InsertProxy(k *Key, hash uint64, member uint16, px Proxy, now uint32) (evicted, ok bool) {
	t.EnableProxy()
	evicted, ok = t.Insert(k, hash, member, StateSynRecv, now)
	if ok {
		i, _, _ := t.find(k, hash)
		px.Flags |= ProxyOn | ProxyPending
		t.proxy[i] = px
	}
	return evicted, ok
}

// EstablishProxy moves the pending proxied connection ref to StateEstablished (its
// member answered) and clears ProxyPending; hash is the one it was filed with.
func (t *Table) EstablishProxy(ref Ref, hash uint64, now uint32) {
	i := uint32(ref)
	if t.proxy == nil || i == 0 || t.entries[i].state == 0 {
		return
	}
	t.proxy[i].Flags &^= ProxyPending
	if t.entries[i].state == StateSynRecv {
		t.refile(i, StateEstablished, now)
		if t.events != nil {
			t.note(i, hash, false)
		}
	}
}

// ProxyOf returns k's proxy state, for session sync: false when k has no entry or
// it is not proxied.
func (t *Table) ProxyOf(k *Key, hash uint64) (Proxy, bool) {
	if t.proxy == nil {
		return Proxy{}, false
	}
	i, _, _ := t.find(k, hash)
	if i == 0 || t.proxy[i].Flags == 0 {
		return Proxy{}, false
	}
	return t.proxy[i], true
}

// InstallProxy is Install for a proxied connection received from a peer, with its
// proxy state (EnableProxy is called if needed).
func (t *Table) InstallProxy(k *Key, hash uint64, member uint16, st State, ttl, now uint32, px Proxy) bool {
	t.EnableProxy()
	if !t.Install(k, hash, member, st, ttl, now) {
		return false
	}
	i, _, _ := t.find(k, hash)
	px.Flags = px.Flags&^ProxyPending | ProxyOn
	t.proxy[i] = px
	return true
}
