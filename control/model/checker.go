package model

import (
	"bytes"
	"errors"

	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/config"
)

// Checker does what Check does and returns the snapshot, reusing the decoding and
// validation of every object that did not change since the snapshot it checked
// before. A node checks the whole configuration at every revision and a write
// changes a few objects of hundreds, so a node spends on each revision about what
// its change costs, not what the configuration costs. The objects of the snapshots
// it returns are shared from one snapshot to the next: they are not to be
// modified. The zero value is ready; it is not safe for concurrent use.
type Checker struct {
	objs map[string]checked // by kind/name
}

// checked is one object as the Checker last saw it.
type checked struct {
	mod   int64
	value []byte
	obj   Object
	err   error // of Decode (obj nil) or of the object's Validate
}

// Check decodes ss into the model, checks every object alone and the whole for
// consistency, as Check does, and returns the snapshot.
func (c *Checker) Check(ss *store.Snapshot) (*Snapshot, error) {
	next := make(map[string]checked, ss.Len())
	s := NewSnapshot(ss.Revision)
	var decodeErrs []error
	for _, kind := range Kinds {
		for _, o := range ss.List(kind) {
			key := o.Kind + "/" + o.Name
			e, ok := c.objs[key]
			if !ok || e.mod != o.ModRevision || !bytes.Equal(e.value, o.Value) {
				e = checked{mod: o.ModRevision, value: o.Value}
				if e.obj, e.err = Decode(o); e.err == nil {
					e.err = e.obj.Validate()
				}
			}
			next[key] = e
			if e.obj == nil {
				decodeErrs = append(decodeErrs, e.err)
				continue
			}
			s.Add(e.obj)
		}
	}
	c.objs = next
	if err := errors.Join(decodeErrs...); err != nil {
		return nil, err
	}
	var ck config.Checker
	for _, o := range s.Objects() {
		ck.Nest(objPath(o.Kind(), o.ObjectName()), c.objs[o.Kind()+"/"+o.ObjectName()].err)
	}
	if err := ck.Err(); err != nil {
		return nil, err
	}
	if err := s.Consistent(); err != nil {
		return nil, err
	}
	return s, nil
}
