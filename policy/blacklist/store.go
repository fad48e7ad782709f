package blacklist

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
)

// ListConfig is a blacklist as a daemon's configuration gives it, by list name.
type ListConfig struct {
	// Files are read at start and again on reload when one of them changed, and
	// their entries merged (text, binary or gzip; see Read). A reload that finds
	// them unchanged keeps what was pushed since. With a state directory, a list with
	// pushed state is loaded from its state file instead, and its files are not read
	// until that state is dropped. Default none: the list starts empty and takes
	// pushes.
	Files []string `yaml:"files,omitempty" json:"files,omitempty"`

	// Action is what a request from a listed client address gets: "forbid" (403) or
	// "close" (HTTP/1.1: the connection closed unanswered; HTTP/2 and HTTP/3: the
	// request's stream reset). A connection from a listed address is closed before
	// its TLS handshake whatever the action. Default forbid.
	Action string `yaml:"action,omitempty" json:"action,omitempty"`
}

// Blacklist actions, the values of ListConfig.Action.
const (
	ActionForbid = "forbid"
	ActionClose  = "close"
)

// Validate checks c and returns every problem, each a *config.FieldError named by its
// path within c ("action", "files[0]").
func (c ListConfig) Validate() error {
	var ck config.Checker
	switch c.Action {
	case "", ActionForbid, ActionClose:
	default:
		ck.Addf("action", "%q: want %s or %s", c.Action, ActionForbid, ActionClose)
	}
	for j, f := range c.Files {
		if f == "" {
			ck.Addf(config.Index("files", j), "empty")
		}
	}
	return ck.Err()
}

// Source is what a list in force was loaded from: its pushed state file, or its
// configured files, with a digest of their names and contents.
type Source struct {
	// StateFile is the state file the list was loaded from or last written to; ""
	// when it was loaded from Files.
	StateFile string
	// Files are the configured files it was loaded from.
	Files  []string
	digest [sha256.Size]byte
}

func (s Source) same(o Source) bool { return s.StateFile == o.StateFile && s.digest == o.digest }

// State files are named after their list: <dir>/blacklist-<list>.bin.
const (
	stateFilePrefix = "blacklist-"
	stateFileSuffix = ".bin"
)

// StatePath is the file under dir that keeps list name's pushed state.
func StatePath(dir, name string) string {
	return filepath.Join(dir, stateFilePrefix+name+stateFileSuffix)
}

// Store keeps a Lists in step with the lists' configured files and with what is
// pushed to them, which it writes, when it has a state directory, to one state file
// per list (binary format, atomically and synced) before putting it in force, so
// pushes survive restarts and reloads. Source may be called from any goroutine; every
// other method changes the lists or reads what they were loaded from, and is called
// from one goroutine (a daemon's owner of its configuration).
type Store struct {
	lists *Lists
	dir   string
	log   *slog.Logger

	cfg     map[string]ListConfig             // the lists' configuration in force
	sources map[string]Source                 // what each list in force was loaded from
	pub     atomic.Pointer[map[string]Source] // sources, for Source
}

// NewStore returns a Store of lists that keeps pushed state in dir ("" keeps it in
// memory only, and a restart loads the files again). A nil log discards.
func NewStore(lists *Lists, dir string, log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st := &Store{lists: lists, dir: dir, log: log}
	st.pub.Store(&map[string]Source{})
	return st
}

// Dir is the state directory, or "".
func (st *Store) Dir() string { return st.dir }

// Source returns what list name in force was loaded from (the zero Source for a
// list loaded from nothing).
func (st *Store) Source(name string) Source { return (*st.pub.Load())[name] }

// Prepared is what Prepare read, ready for Commit. Nothing of it is in force yet.
type Prepared struct {
	cfg     map[string]ListConfig
	sets    map[string]*Set // to swap in, by list; nil empties the list
	sources map[string]Source
}

// Prepare reads what the lists names (every list there is: the global one, each
// listener's, those in cfg) are to hold: a list's state file when the state
// directory has one for it, else its configured files in cfg. Sources that are the
// same as what a list in force was loaded from (same state file or files, same
// contents) are not parsed again, so a list keeps what was pushed since. Nothing is
// swapped in: a bad file fails the whole, naming the list, the file and, for text,
// the line.
func (st *Store) Prepare(cfg map[string]ListConfig, names []string) (*Prepared, error) {
	p := &Prepared{cfg: cfg, sets: map[string]*Set{}, sources: map[string]Source{}}
	for _, name := range names {
		if st.dir != "" {
			set, src, found, err := readState(StatePath(st.dir, name), name, st.sources[name])
			if err != nil {
				return nil, err
			}
			if found {
				p.sources[name] = src
				if set != nil {
					p.sets[name] = set
				}
				continue
			}
		}
		files := cfg[name].Files
		if len(files) == 0 {
			continue
		}
		data, src, err := readListFiles(name, files)
		if err != nil {
			return nil, err
		}
		p.sources[name] = src
		if old, ok := st.sources[name]; ok && old.same(src) {
			continue
		}
		if p.sets[name], err = parseListFiles(name, files, data); err != nil {
			return nil, err
		}
	}
	for name := range st.sources {
		if _, ok := p.sources[name]; !ok {
			p.sets[name] = nil
		}
	}
	return p, nil
}

// Commit puts what Prepare read in force, which cannot fail: the lists that changed
// are swapped, and the configuration becomes the one Drop goes back to.
func (st *Store) Commit(p *Prepared) {
	for _, name := range slices.Sorted(maps.Keys(p.sets)) {
		s := p.sets[name]
		st.lists.Listener(name).Replace(s)
		switch src := p.sources[name]; {
		case s == nil:
			st.log.Info("blacklist emptied: it has neither files nor pushed state any more", "list", name)
		case src.StateFile != "":
			st.log.Info("blacklist loaded from its pushed state", "list", name, "entries", s.Len(), "state_file", src.StateFile)
		default:
			st.log.Info("blacklist loaded from its files", "list", name, "entries", s.Len(), "files", src.Files)
		}
	}
	st.cfg = p.cfg
	st.setSources(p.sources)
}

// setSources makes m what the lists in force were loaded from; m is not changed
// afterwards.
func (st *Store) setSources(m map[string]Source) {
	st.sources = m
	st.pub.Store(&m)
}

// setSource records what list name was loaded from; the zero Source forgets it.
func (st *Store) setSource(name string, src Source) {
	m := maps.Clone(st.sources)
	if m == nil {
		m = map[string]Source{}
	}
	if src.StateFile == "" && src.Files == nil {
		delete(m, name)
	} else {
		m[name] = src
	}
	st.setSources(m)
}

// StateWriteError is a change refused because the list's state file could not be
// written or removed; the list in force stays. It wraps daemon.ErrNotDurable in the
// one case where the change is in force: the file was written but its directory
// could not be synced.
type StateWriteError struct{ Err error }

func (e *StateWriteError) Error() string { return e.Err.Error() }
func (e *StateWriteError) Unwrap() error { return e.Err }

// Replace puts s in force as l's entries. With a state directory it first writes
// them, less those already expired, to l's state file; if that fails, l is left as
// it was and the error is a *StateWriteError (see there for the one exception).
func (st *Store) Replace(l *List, s *Set) error {
	return st.commit(l, s, l.Replace)
}

// Apply changes l by d. With a state directory the new entries are computed aside,
// written, then swapped in (as Replace); without, the list applies the delta itself.
// A delta the list refuses is returned as List.Apply returns it.
func (st *Store) Apply(l *List, d *Delta) error {
	if st.dir == "" {
		return l.Apply(d)
	}
	next, err := l.Next(d)
	if err != nil {
		return err
	}
	return st.commit(l, next, l.ReplaceDelta)
}

// commit is Replace, with swap putting the set in force (Replace, or ReplaceDelta
// for the result of a delta, so the update is counted as what it was).
func (st *Store) commit(l *List, s *Set, swap func(*Set)) error {
	if st.dir == "" {
		swap(s)
		return nil
	}
	s = Unexpired(s, time.Now())
	path := StatePath(st.dir, l.Name())
	h := sha256.New()
	err := daemon.WriteFileAtomic(path, 0o600, func(w io.Writer) error {
		return WriteBinary(io.MultiWriter(w, h), s)
	})
	if err != nil && !errors.Is(err, daemon.ErrNotDurable) {
		return &StateWriteError{err}
	}
	swap(s)
	src := Source{StateFile: path}
	h.Sum(src.digest[:0])
	st.setSource(l.Name(), src)
	if err != nil {
		return &StateWriteError{fmt.Errorf("the list is in force and in its state file, which may not survive a power loss: %w", err)}
	}
	return nil
}

// Drop takes list l back to its configured files (empty without any), removing its
// state file first when there is a state directory. A file that cannot be read
// changes nothing and is returned as is; a state file that cannot be removed changes
// nothing and is a *StateWriteError.
func (st *Store) Drop(l *List) error {
	name := l.Name()
	var set *Set
	var src Source
	if files := st.cfg[name].Files; len(files) > 0 {
		data, s, err := readListFiles(name, files)
		if err == nil {
			set, err = parseListFiles(name, files, data)
		}
		if err != nil {
			return err
		}
		src = s
	}
	if st.dir != "" {
		if err := daemon.RemoveFileDurably(StatePath(st.dir, name)); err != nil {
			return &StateWriteError{err}
		}
	}
	l.Replace(set)
	st.setSource(name, src)
	return nil
}

// PrepareDir creates the state directory if needed, removes the temporary files a
// crash may have left in it, checks that it is writable, and warns of state files
// that belong to no list in names. Without a state directory it does nothing.
func (st *Store) PrepareDir(names []string) error {
	if st.dir == "" {
		return nil
	}
	return prepareStateDir(st.dir, names, st.log)
}

func prepareStateDir(dir string, names []string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state_dir: %w", err)
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("state_dir: %w", err)
	}
	for _, de := range des {
		n := de.Name()
		switch {
		case strings.HasPrefix(n, "."+stateFilePrefix) && strings.Contains(n, daemon.TempSuffix):
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				return fmt.Errorf("state_dir: removing a temporary file left behind: %w", err)
			}
			log.Info("state_dir: temporary file left by an interrupted write removed", "file", filepath.Join(dir, n))
		case strings.HasPrefix(n, stateFilePrefix) && strings.HasSuffix(n, stateFileSuffix):
			list := strings.TrimSuffix(strings.TrimPrefix(n, stateFilePrefix), stateFileSuffix)
			if !slices.Contains(names, list) {
				log.Warn("state_dir: state file of no list, ignored", "file", filepath.Join(dir, n), "list", list)
			}
		}
	}
	f, err := os.CreateTemp(dir, "."+stateFilePrefix+"probe"+daemon.TempSuffix+"*")
	if err != nil {
		return fmt.Errorf("state_dir %s is not writable: %w", dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// readState reads list name's state file at path, if there is one (found). The set
// is nil when the file is what old says the list was loaded from.
func readState(path, name string, old Source) (set *Set, src Source, found bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, src, false, nil
	}
	if err != nil {
		return nil, src, false, fmt.Errorf("blacklists.%s: pushed state: %w", name, err)
	}
	src = Source{StateFile: path, digest: sha256.Sum256(data)}
	if old.same(src) {
		return nil, src, true, nil
	}
	set, err = ReadBinary(bytes.NewReader(data))
	if err != nil {
		return nil, src, true, fmt.Errorf("blacklists.%s: pushed state %s: %w (remove the file to load the list from its configured files)", name, path, err)
	}
	return set, src, true, nil
}

// readListFiles reads a list's configured files and digests their names and contents.
func readListFiles(name string, files []string) ([][]byte, Source, error) {
	data := make([][]byte, len(files))
	h := sha256.New()
	for i, f := range files {
		var err error
		if data[i], err = os.ReadFile(f); err != nil {
			return nil, Source{}, fmt.Errorf("blacklists.%s: %w", name, err)
		}
		sum := sha256.Sum256(data[i])
		fmt.Fprintf(h, "%q %x\n", f, sum)
	}
	src := Source{Files: slices.Clone(files)}
	h.Sum(src.digest[:0])
	return data, src, nil
}

// parseListFiles parses the files readListFiles read and merges their entries.
func parseListFiles(name string, files []string, data [][]byte) (*Set, error) {
	var b Builder
	defer b.Reset()
	for i, f := range files {
		s, err := Read(bytes.NewReader(data[i]))
		if err != nil {
			return nil, fmt.Errorf("blacklists.%s: %s: %w", name, f, err)
		}
		if len(files) == 1 {
			return s, nil
		}
		for e := range s.All() {
			b.Add(e.Prefix, e.Expires)
		}
	}
	return b.Build(), nil
}

// Unexpired returns s without the entries expired at now (s itself when it has none).
func Unexpired(s *Set, now time.Time) *Set {
	if s.Stats().Expiring == 0 {
		return s
	}
	expired := func(e Entry) bool { return !e.Expires.IsZero() && !now.Before(e.Expires) }
	found := false
	for e := range s.All() {
		if expired(e) {
			found = true
			break
		}
	}
	if !found {
		return s
	}
	var b Builder
	defer b.Reset()
	for e := range s.All() {
		b.Add(e.Prefix, e.Expires)
	}
	return b.BuildAt(now)
}
