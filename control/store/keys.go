package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Prefix is the prefix of every object's key: /tiergate/v1/<kind>/<name>.
const Prefix = "/tiergate/v1/"

// headKey is rewritten by every write (see the package doc).
const headKey = "/tiergate/meta/v1/head"

// Limits of the objects and change sets the Store writes.
const (
	// MaxValueBytes bounds an object's JSON value (etcd takes requests up to 1.5
	// MiB).
	MaxValueBytes = 1 << 20
	// MaxChangeSetBytes bounds the keys and values of one change set together.
	MaxChangeSetBytes = MaxValueBytes + 256<<10
	// MaxChanges bounds the changes of one change set (etcd's default limit is 128
	// operations per transaction, and a change set adds one of its own).
	MaxChanges = 100

	maxKindLen = 63
	maxNameLen = 253
)

// Key returns the etcd key of an object.
func Key(kind, name string) string { return Prefix + kind + "/" + name }

// kindPrefix is the prefix of every key of kind.
func kindPrefix(kind string) string { return Prefix + kind + "/" }

// splitKey returns the kind and name of an object's key.
func splitKey(key string) (kind, name string, ok bool) {
	rest, ok := strings.CutPrefix(key, Prefix)
	if !ok {
		return "", "", false
	}
	kind, name, ok = strings.Cut(rest, "/")
	return kind, name, ok && CheckKind(kind) == nil && CheckName(name) == nil
}

// CheckKind returns an error unless kind may name a kind of object.
func CheckKind(kind string) error {
	if kind == "" || len(kind) > maxKindLen {
		return fmt.Errorf("kind %q: want 1 to %d bytes", kind, maxKindLen)
	}
	for i, c := range []byte(kind) {
		switch {
		case c >= 'a' && c <= 'z':
		case i > 0 && (c >= '0' && c <= '9' || c == '-'):
		default:
			return fmt.Errorf("kind %q: want lower-case letters, digits and '-', starting with a letter", kind)
		}
	}
	return nil
}

// CheckName returns an error unless name may name an object.
func CheckName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("name %q: want 1 to %d bytes", name, maxNameLen)
	}
	for i, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == ':' || c == '-'):
		default:
			return fmt.Errorf("name %q: want letters, digits, '.', '_', ':' and '-', starting with a letter or digit", name)
		}
	}
	return nil
}

// checkKey checks kind and name together.
func checkKey(kind, name string) error {
	if err := CheckKind(kind); err != nil {
		return err
	}
	return CheckName(name)
}

// checkValue checks that value is JSON within MaxValueBytes.
func checkValue(kind, name string, value []byte) error {
	if len(value) > MaxValueBytes {
		return fmt.Errorf("store: %s/%s: value of %d bytes is over %d: %w", kind, name, len(value), MaxValueBytes, ErrTooLarge)
	}
	if !json.Valid(value) {
		return fmt.Errorf("store: %s/%s: value is not JSON", kind, name)
	}
	return nil
}

// Object is a stored object at one revision.
type Object struct {
	Kind string
	Name string
	// Value is the object's JSON; nil for an object deleted (in an Event).
	Value json.RawMessage
	// ModRevision is the revision of the object's last change, its version for
	// If-Match; 0 in a change set's resulting snapshot for what it writes.
	ModRevision int64
	// CreateRevision is the revision the object was created at.
	CreateRevision int64
	// Version counts the changes since the object was created: 1 when new.
	Version int64
}

// Snapshot is every object at one revision. It is not to be modified.
type Snapshot struct {
	// Revision is the revision it was read at. In the snapshot a change set's check
	// is given it is the revision read, the change set's writes applied on top.
	Revision int64

	objects map[string]map[string]Object // kind → name → object
}

// NewSnapshot returns a snapshot at revision rev of objs. For tests and for
// snapshots kept outside the store (a node's copy on disk).
func NewSnapshot(rev int64, objs []Object) *Snapshot {
	s := &Snapshot{Revision: rev, objects: map[string]map[string]Object{}}
	for _, o := range objs {
		s.put(o)
	}
	return s
}

func (s *Snapshot) put(o Object) {
	m := s.objects[o.Kind]
	if m == nil {
		m = map[string]Object{}
		s.objects[o.Kind] = m
	}
	m[o.Name] = o
}

func (s *Snapshot) remove(kind, name string) {
	delete(s.objects[kind], name)
	if len(s.objects[kind]) == 0 {
		delete(s.objects, kind)
	}
}

// Get returns the object of kind and name, if it is in s.
func (s *Snapshot) Get(kind, name string) (Object, bool) {
	o, ok := s.objects[kind][name]
	return o, ok
}

// Kinds returns the kinds s has objects of, sorted.
func (s *Snapshot) Kinds() []string {
	out := make([]string, 0, len(s.objects))
	for k := range s.objects {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// List returns the objects of kind, sorted by name.
func (s *Snapshot) List(kind string) []Object {
	m := s.objects[kind]
	out := make([]Object, 0, len(m))
	for _, o := range m {
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b Object) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// All returns every object, sorted by kind and name.
func (s *Snapshot) All() []Object {
	var out []Object
	for _, k := range s.Kinds() {
		out = append(out, s.List(k)...)
	}
	return out
}

// Len returns the number of objects.
func (s *Snapshot) Len() int {
	n := 0
	for _, m := range s.objects {
		n += len(m)
	}
	return n
}

// clone returns a copy of s whose maps may be changed.
func (s *Snapshot) clone() *Snapshot {
	c := &Snapshot{Revision: s.Revision, objects: make(map[string]map[string]Object, len(s.objects))}
	for k, m := range s.objects {
		n := make(map[string]Object, len(m))
		for name, o := range m {
			n[name] = o
		}
		c.objects[k] = n
	}
	return c
}

// Errors of the Store, matched with errors.Is.
var (
	// ErrNotFound: no such object (at the revision asked for).
	ErrNotFound = errors.New("not found")
	// ErrConflict: a write's expected revision is not the object's (a
	// *ConflictError says which).
	ErrConflict = errors.New("conflict")
	// ErrCompacted: the revision asked for was dropped by compaction.
	ErrCompacted = errors.New("revision compacted")
	// ErrTooLarge: an object or change set over MaxValueBytes, MaxChangeSetBytes or
	// MaxChanges.
	ErrTooLarge = errors.New("too large")
	// ErrNoSpace: etcd's backend quota is reached and it refuses writes.
	ErrNoSpace = errors.New("store quota reached")
	// ErrClosed: the Store was closed.
	ErrClosed = errors.New("store: closed")
)

// Any is the expected revision of a write that holds whatever the object's
// revision is (no If-Match). An expected revision of 0 means the object must not
// exist; above 0, it must be the object's ModRevision.
const Any int64 = -1

// ConflictError is a write refused because an object's revision was not the one
// expected. It matches ErrConflict.
type ConflictError struct {
	Kind, Name string
	// Expected is the revision the write expected (0: absent); Actual is the
	// object's (0: absent). For a change set retried too often because others kept
	// writing, Kind and Name are empty.
	Expected, Actual int64
	// Since is set for a change set refused because the store was written after
	// ChangeSet.Since; Kind and Name are empty.
	Since int64
}

func (e *ConflictError) Error() string {
	if e.Since > 0 {
		return fmt.Sprintf("store: the configuration was changed after revision %d", e.Since)
	}
	if e.Kind == "" {
		return "store: the store kept changing under the change set's check; try again"
	}
	rev := func(r int64) string {
		if r == 0 {
			return "absent"
		}
		return fmt.Sprintf("at revision %d", r)
	}
	return fmt.Sprintf("store: %s/%s is %s, not %s as expected", e.Kind, e.Name, rev(e.Actual), rev(e.Expected))
}

// Is makes a ConflictError match ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// CheckError is a change set refused by its consistency check; Err is what the
// check returned (field errors of the model, say).
type CheckError struct {
	// Revision is the revision the check saw, before the change set.
	Revision int64
	Err      error
}

func (e *CheckError) Error() string {
	return fmt.Sprintf("store: change set refused by the consistency check (at revision %d): %v", e.Revision, e.Err)
}

func (e *CheckError) Unwrap() error { return e.Err }
