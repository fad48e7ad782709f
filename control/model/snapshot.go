package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l7/listener"
	"github.com/tiergate/tiergate/policy/route"
)

// Snapshot is the cluster configuration at one revision: every object by kind and
// name.
type Snapshot struct {
	// Revision is the store revision the objects were read at.
	Revision int64

	Listeners    map[string]*Listener
	Routing      map[string]*RoutingPolicy
	Pools        map[string]*Pool
	Certificates map[string]*Certificate
	CertBindings map[string]*CertBinding
	L4Rules      map[string]*L4Rule
	L4Pools      map[string]*L4Pool
	L4BGP        map[string]*L4BGP // at most one (Consistent); BGP returns it
}

// NewSnapshot returns a snapshot at revision rev holding objs (by their names; a
// later object replaces an earlier one of the same kind and name).
func NewSnapshot(rev int64, objs ...Object) *Snapshot {
	s := &Snapshot{
		Revision:     rev,
		Listeners:    map[string]*Listener{},
		Routing:      map[string]*RoutingPolicy{},
		Pools:        map[string]*Pool{},
		Certificates: map[string]*Certificate{},
		CertBindings: map[string]*CertBinding{},
		L4Rules:      map[string]*L4Rule{},
		L4Pools:      map[string]*L4Pool{},
		L4BGP:        map[string]*L4BGP{},
	}
	for _, o := range objs {
		s.Add(o)
	}
	return s
}

// Add puts o in s under its name.
func (s *Snapshot) Add(o Object) {
	switch o := o.(type) {
	case *Listener:
		s.Listeners[o.Name] = o
	case *RoutingPolicy:
		s.Routing[o.Name] = o
	case *Pool:
		s.Pools[o.Name] = o
	case *Certificate:
		s.Certificates[o.Name] = o
	case *CertBinding:
		s.CertBindings[o.Name] = o
	case *L4Rule:
		s.L4Rules[o.Name] = o
	case *L4Pool:
		s.L4Pools[o.Name] = o
	case *L4BGP:
		s.L4BGP[o.Name] = o
	default:
		panic(fmt.Sprintf("model: Add of %T", o))
	}
}

// Objects returns every object, by kind in the order of Kinds, then by name.
func (s *Snapshot) Objects() []Object {
	var out []Object
	appendAll(&out, s.Listeners)
	appendAll(&out, s.Routing)
	appendAll(&out, s.Pools)
	appendAll(&out, s.Certificates)
	appendAll(&out, s.CertBindings)
	appendAll(&out, s.L4Rules)
	appendAll(&out, s.L4Pools)
	appendAll(&out, s.L4BGP)
	return out
}

func appendAll[T any, PT interface {
	*T
	Object
}](out *[]Object, m map[string]PT) {
	for _, name := range slices.Sorted(maps.Keys(m)) {
		*out = append(*out, m[name])
	}
}

// newObject returns a new empty object of kind, or nil for a kind the model does not
// have.
func newObject(kind string) Object {
	switch kind {
	case KindListener:
		return &Listener{}
	case KindRouting:
		return &RoutingPolicy{}
	case KindPool:
		return &Pool{}
	case KindCertificate:
		return &Certificate{}
	case KindCertBinding:
		return &CertBinding{}
	case KindL4Rule:
		return &L4Rule{}
	case KindL4Pool:
		return &L4Pool{}
	case KindL4BGP:
		return &L4BGP{}
	}
	return nil
}

// objPath is the path of an object in field errors: "<kind>/<name>".
func objPath(kind, name string) string { return kind + "/" + name }

// Decode decodes a stored object of a kind the model has, refusing fields the model
// does not have and a name that is not the one it is stored under. Errors are
// *config.FieldErrors at "<kind>/<name>".
func Decode(o store.Object) (Object, error) {
	obj := newObject(o.Kind)
	if obj == nil {
		return nil, &config.FieldError{Path: objPath(o.Kind, o.Name), Err: fmt.Errorf("the model has no kind %q", o.Kind)}
	}
	dec := json.NewDecoder(bytes.NewReader(o.Value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return nil, &config.FieldError{Path: objPath(o.Kind, o.Name), Err: fmt.Errorf("decoding: %w", err)}
	}
	if dec.More() {
		return nil, &config.FieldError{Path: objPath(o.Kind, o.Name), Err: errors.New("decoding: data after the object")}
	}
	if obj.ObjectName() != o.Name {
		return nil, &config.FieldError{Path: objPath(o.Kind, o.Name) + ".name", Err: fmt.Errorf("%q is not the name the object is stored under", obj.ObjectName())}
	}
	return obj, nil
}

// Put returns the store change that writes o, expecting it at ifRevision (store.Any,
// 0 to create, or its ModRevision). o is not validated: the change set's check does
// that (Check).
func Put(o Object, ifRevision int64) (store.Change, error) {
	data, err := json.Marshal(o)
	if err != nil {
		return store.Change{}, fmt.Errorf("model: encoding %s: %w", objPath(o.Kind(), o.ObjectName()), err)
	}
	return store.Change{Kind: o.Kind(), Name: o.ObjectName(), Value: data, IfRevision: ifRevision}, nil
}

// FromStore decodes every object of a store snapshot whose kind the model has;
// objects of other kinds are left for the packages that own them. The error joins
// every object that does not decode.
func FromStore(ss *store.Snapshot) (*Snapshot, error) {
	s := NewSnapshot(ss.Revision)
	var errs []error
	for _, kind := range Kinds {
		for _, o := range ss.List(kind) {
			obj, err := Decode(o)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			s.Add(obj)
		}
	}
	return s, errors.Join(errs...)
}

// Check is the consistency check of the store's change sets (store.ChangeSet.Check):
// the snapshot decodes, every object is valid (Validate) and the whole is consistent
// (Consistent).
func Check(ss *store.Snapshot) error {
	_, err := new(Checker).Check(ss)
	return err
}

// Validate checks every object alone (its Validate) and returns every problem, each
// a *config.FieldError at "<kind>/<name>.<field>".
func (s *Snapshot) Validate() error {
	var ck config.Checker
	for _, o := range s.Objects() {
		ck.Nest(objPath(o.Kind(), o.ObjectName()), o.Validate())
	}
	return ck.Err()
}

// Consistent checks what the objects say of each other and returns every problem,
// each a *config.FieldError at "<kind>/<name>.<field>": a routing policy for a
// listener that does not exist, a route to a missing pool, a listener no
// certificate is bound to, a binding to a missing certificate or listener, two
// certificates of one key type in one binding, a server name a binding's
// certificates do not serve, one name bound twice on a listener or two defaults, two
// listeners on one address, an L4 rule to a missing pool or two on one VIP, protocol
// and port. It assumes every object is valid alone (Validate).
func (s *Snapshot) Consistent() error {
	var ck config.Checker
	s.listeners(&ck)
	s.routing(&ck)
	s.bindings(&ck)
	s.l4(&ck)
	if len(s.L4BGP) > 1 {
		names := slices.Sorted(maps.Keys(s.L4BGP))
		for _, n := range names[1:] {
			ck.Addf(objPath(KindL4BGP, n), "a second l4-bgp object (%s is one): the cluster has one BGP setting", names[0])
		}
	}
	return ck.Err()
}

// BGP returns the cluster's l4-bgp object, or nil when there is none.
func (s *Snapshot) BGP() *L4BGP {
	for _, name := range slices.Sorted(maps.Keys(s.L4BGP)) {
		return s.L4BGP[name]
	}
	return nil
}

func (s *Snapshot) listeners(ck *config.Checker) {
	addrs := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(s.Listeners)) {
		addr := s.Listeners[name].Addr
		if addr == "" {
			addr = listener.DefaultAddr
		}
		if first, dup := addrs[addr]; dup {
			ck.Addf(objPath(KindListener, name)+".addr", "%q is also the address of listeners/%s", addr, first)
			continue
		}
		addrs[addr] = name
	}
}

// RouteConfig returns the routing policy of an l7d node: every RoutingPolicy and
// every Pool, by name.
func (s *Snapshot) RouteConfig() *route.Config {
	rc := &route.Config{}
	for _, name := range slices.Sorted(maps.Keys(s.Routing)) {
		rc.Listeners = append(rc.Listeners, s.Routing[name].Listener)
	}
	for _, name := range slices.Sorted(maps.Keys(s.Pools)) {
		rc.Pools = append(rc.Pools, s.Pools[name].Pool)
	}
	return rc
}

func (s *Snapshot) routing(ck *config.Checker) {
	listeners := slices.Sorted(maps.Keys(s.Routing))
	for _, name := range listeners {
		if _, ok := s.Listeners[name]; !ok {
			ck.Addf(objPath(KindRouting, name)+".name", "no listener is named %q", name)
		}
	}
	// route's own validation of the whole policy finds the routes to missing pools;
	// its paths ("listeners[2].vhosts[0]…", "pools[1]…") name objects here. It is
	// given the pools the routes name only: each pool was checked alone (Validate),
	// and one no route names relates to nothing, so a node checking a snapshot
	// with hundreds of pools does not check them all again on every revision.
	rc := &route.Config{}
	named := map[string]bool{}
	for _, name := range listeners {
		rc.Listeners = append(rc.Listeners, s.Routing[name].Listener)
		for _, vh := range s.Routing[name].VHosts {
			for _, rt := range vh.Routes {
				if _, ok := s.Pools[rt.Action.Pool]; ok {
					named[rt.Action.Pool] = true
				}
			}
		}
	}
	pools := slices.Sorted(maps.Keys(named))
	for _, name := range pools {
		rc.Pools = append(rc.Pools, s.Pools[name].Pool)
	}
	ck.Nest("", mapPaths(rc.Validate(), func(path string) string {
		if p, ok := indexed(path, "listeners", listeners, KindRouting); ok {
			return p
		}
		if p, ok := indexed(path, "pools", pools, KindPool); ok {
			return p
		}
		return path
	}))
}

// indexed maps a path into element i of list base ("listeners[2].x") to the path of
// object names[i] of kind ("routing/web.x").
func indexed(path, base string, names []string, kind string) (string, bool) {
	rest, ok := strings.CutPrefix(path, base+"[")
	if !ok {
		return "", false
	}
	num, rest, ok := strings.Cut(rest, "]")
	i, err := strconv.Atoi(num)
	if !ok || err != nil || i < 0 || i >= len(names) {
		return "", false
	}
	return objPath(kind, names[i]) + rest, true
}

// mapPaths returns err with the path of every field error in it mapped by fn.
func mapPaths(err error, fn func(string) string) error {
	if err == nil {
		return nil
	}
	var ck config.Checker
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var fe *config.FieldError
		if errors.As(err, &fe) {
			ck.Add(fn(fe.Path), fe.Err)
		} else {
			ck.Add("", err)
		}
	}
	walk(err)
	return ck.Err()
}

func (s *Snapshot) bindings(ck *config.Checker) {
	bound := map[string]bool{}       // listeners with a binding
	served := map[[2]string]string{} // {listener, server name} → binding
	defaults := map[string]string{}  // listener → default binding
	for _, bname := range slices.Sorted(maps.Keys(s.CertBindings)) {
		b := s.CertBindings[bname]
		path := objPath(KindCertBinding, bname)
		var certs []*Certificate
		keyTypes := map[string]string{}
		for i, cname := range b.Certificates {
			c, ok := s.Certificates[cname]
			if !ok {
				ck.Addf(config.Index(path+".certificates", i), "no certificate is named %q", cname)
				continue
			}
			if other, dup := keyTypes[c.KeyType]; dup {
				ck.Addf(config.Index(path+".certificates", i), "%q has the same key type (%s) as %q: one certificate per key type", cname, c.KeyType, other)
				continue
			}
			keyTypes[c.KeyType] = cname
			certs = append(certs, c)
		}
		for i, lname := range b.Listeners {
			if _, ok := s.Listeners[lname]; !ok {
				ck.Addf(config.Index(path+".listeners", i), "no listener is named %q", lname)
			}
			bound[lname] = true
		}
		// The names served: those given, each served by every certificate; else every
		// certificate's names, which the others must serve too.
		var names []string
		if len(b.ServerNames) > 0 {
			for i, n := range b.ServerNames {
				n = strings.ToLower(n)
				names = append(names, n)
				for _, c := range certs {
					if !c.Serves(n) {
						ck.Addf(config.Index(path+".server_names", i), "certificates/%s does not serve %q (its names: %s)", c.Name, n, strings.Join(c.SANs, ", "))
					}
				}
			}
		} else {
			for _, c := range certs {
				for _, n := range c.SANs {
					if slices.Contains(names, n) {
						continue
					}
					names = append(names, n)
					for _, other := range certs {
						if !other.Serves(n) {
							ck.Addf(path+".certificates", "certificates/%s does not serve %q, which certificates/%s does: certificates side by side serve the same names (or give server_names)", other.Name, n, c.Name)
						}
					}
				}
			}
		}
		for _, lname := range b.Listeners {
			for _, n := range names {
				k := [2]string{lname, n}
				if first, dup := served[k]; dup {
					ck.Addf(path, "%q on listener %q is already served by cert-bindings/%s", n, lname, first)
					continue
				}
				served[k] = bname
			}
			if b.Default {
				if first, dup := defaults[lname]; dup {
					ck.Addf(path+".default", "listener %q already has a default: cert-bindings/%s", lname, first)
				} else {
					defaults[lname] = bname
				}
			}
		}
	}
	for _, lname := range slices.Sorted(maps.Keys(s.Listeners)) {
		if !bound[lname] {
			ck.Addf(objPath(KindListener, lname), "no certificate is bound to it (no cert-binding names it)")
		}
	}
}

// L4 returns the forwarding of the L4 tier: every L4 rule, by name, and every L4
// pool; what only an LD has (its addresses, tunnel) comes from its own file.
func (s *Snapshot) L4() (rules []datapath.RuleConfig, pools map[string]datapath.PoolConfig) {
	for _, name := range slices.Sorted(maps.Keys(s.L4Rules)) {
		rules = append(rules, s.L4Rules[name].RuleConfig)
	}
	pools = make(map[string]datapath.PoolConfig, len(s.L4Pools))
	for name, p := range s.L4Pools {
		pools[name] = p.PoolConfig
	}
	return rules, pools
}

func (s *Snapshot) l4(ck *config.Checker) {
	if len(s.L4Rules) == 0 && len(s.L4Pools) == 0 {
		return
	}
	dc := l4Config()
	dc.Rules, dc.Pools = s.L4()
	rules := slices.Sorted(maps.Keys(s.L4Rules))
	// Longest first: a pool named "a.b" is matched before a pool "a".
	pools := slices.SortedFunc(maps.Keys(s.L4Pools), func(a, b string) int { return len(b) - len(a) })
	ck.Nest("", mapPaths(dc.Validate(), func(path string) string {
		if p, ok := indexed(path, "rules", rules, KindL4Rule); ok {
			return p
		}
		for _, name := range pools {
			base := "pools." + name
			if rest, ok := strings.CutPrefix(path, base); ok && (rest == "" || rest[0] == '.' || rest[0] == '[') {
				return objPath(KindL4Pool, name) + rest
			}
		}
		return path
	}))
}
