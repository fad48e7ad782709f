package l7d

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
	"time"

	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// listSource is what a list in force was loaded from: its pushed state file, or its
// configured files, with a digest of their names and contents.
type listSource struct {
	state  string   // the state file; "" when loaded from files
	files  []string // the configured files, when loaded from them
	digest [sha256.Size]byte
}

func (s listSource) same(o listSource) bool { return s.state == o.state && s.digest == o.digest }

// State files are named after their list: <state_dir>/blacklist-<list>.bin.
const (
	stateFilePrefix = "blacklist-"
	stateFileSuffix = ".bin"
)

// statePath is the file under dir that keeps list name's pushed state.
func statePath(dir, name string) string {
	return filepath.Join(dir, stateFilePrefix+name+stateFileSuffix)
}

// listNames returns the lists cfg has: the global one, each listener's, and any
// named under blacklists, sorted.
func listNames(cfg *FileConfig) []string {
	names := []string{blacklist.GlobalName}
	for _, l := range cfg.Listeners {
		names = append(names, l.Name)
	}
	for name := range cfg.Blacklists {
		names = append(names, name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// readBlacklists reads what cfg's lists are to hold: a list's state file when
// cfg.StateDir has one for it, else its configured files. Sources that are the same
// as what loaded says a list was loaded from (same state file or files, same
// contents) are not parsed again, so a list keeps what was pushed since. It returns
// the sets to swap in, by list (nil: empty the list, which has neither state nor
// files any more), and the sources of every list loaded from either once they are
// swapped in. Nothing is swapped here: a bad file fails the whole, naming the list,
// the file and, for text, the line.
func readBlacklists(cfg *FileConfig, loaded map[string]listSource) (map[string]*blacklist.Set, map[string]listSource, error) {
	sets := map[string]*blacklist.Set{}
	sources := map[string]listSource{}
	for _, name := range listNames(cfg) {
		if cfg.StateDir != "" {
			set, src, found, err := readState(statePath(cfg.StateDir, name), name, loaded[name])
			if err != nil {
				return nil, nil, err
			}
			if found {
				sources[name] = src
				if set != nil {
					sets[name] = set
				}
				continue
			}
		}
		files := cfg.Blacklists[name].Files
		if len(files) == 0 {
			continue
		}
		data, src, err := readListFiles(name, files)
		if err != nil {
			return nil, nil, err
		}
		sources[name] = src
		if old, ok := loaded[name]; ok && old.same(src) {
			continue
		}
		if sets[name], err = parseListFiles(name, files, data); err != nil {
			return nil, nil, err
		}
	}
	for name := range loaded {
		if _, ok := sources[name]; !ok {
			sets[name] = nil
		}
	}
	return sets, sources, nil
}

// readState reads list name's state file at path, if there is one (found). The set
// is nil when the file is what old says the list was loaded from.
func readState(path, name string, old listSource) (set *blacklist.Set, src listSource, found bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, src, false, nil
	}
	if err != nil {
		return nil, src, false, fmt.Errorf("blacklists.%s: pushed state: %w", name, err)
	}
	src = listSource{state: path, digest: sha256.Sum256(data)}
	if old.same(src) {
		return nil, src, true, nil
	}
	set, err = blacklist.ReadBinary(bytes.NewReader(data))
	if err != nil {
		return nil, src, true, fmt.Errorf("blacklists.%s: pushed state %s: %w (remove the file to load the list from its configured files)", name, path, err)
	}
	return set, src, true, nil
}

// readListFiles reads a list's configured files and digests their names and contents.
func readListFiles(name string, files []string) ([][]byte, listSource, error) {
	data := make([][]byte, len(files))
	h := sha256.New()
	for i, f := range files {
		var err error
		if data[i], err = os.ReadFile(f); err != nil {
			return nil, listSource{}, fmt.Errorf("blacklists.%s: %w", name, err)
		}
		sum := sha256.Sum256(data[i])
		fmt.Fprintf(h, "%q %x\n", f, sum)
	}
	src := listSource{files: slices.Clone(files)}
	h.Sum(src.digest[:0])
	return data, src, nil
}

// parseListFiles parses the files readListFiles read and merges their entries.
func parseListFiles(name string, files []string, data [][]byte) (*blacklist.Set, error) {
	var b blacklist.Builder
	for i, f := range files {
		s, err := blacklist.Read(bytes.NewReader(data[i]))
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

// sources returns what the lists in force were loaded from, by list, as the owner
// last published it. It must not be changed.
func (d *Daemon) sources() map[string]listSource {
	if m := d.srcs.Load(); m != nil {
		return *m
	}
	return nil
}

// setSources makes m what the lists in force were loaded from, and publishes it; m
// is not changed afterwards.
func (c *control) setSources(m map[string]listSource) {
	c.sources = m
	c.d.srcs.Store(&m)
}

// setSource records what list name was loaded from; the zero listSource forgets it.
func (c *control) setSource(name string, src listSource) {
	m := maps.Clone(c.sources)
	if m == nil {
		m = map[string]listSource{}
	}
	if src.state == "" && src.files == nil {
		delete(m, name)
	} else {
		m[name] = src
	}
	c.setSources(m)
}

// swapBlacklists puts sets in force.
func (c *control) swapBlacklists(sets map[string]*blacklist.Set, sources map[string]listSource) {
	d := c.d
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		s := sets[name]
		d.lists.Listener(name).Replace(s)
		switch src := sources[name]; {
		case s == nil:
			d.log.Info("blacklist emptied: it has neither files nor pushed state any more", "list", name)
		case src.state != "":
			d.log.Info("blacklist loaded from its pushed state", "list", name, "entries", s.Len(), "state_file", src.state)
		default:
			d.log.Info("blacklist loaded from its files", "list", name, "entries", s.Len(), "files", src.files)
		}
	}
	c.setSources(sources)
}

// errStateWrite is a push refused because its state could not be written.
type errStateWrite struct{ err error }

func (e *errStateWrite) Error() string { return e.err.Error() }
func (e *errStateWrite) Unwrap() error { return e.err }

// commit puts s in force as l's entries. With a state_dir it first writes them, less
// those already expired, to l's state file; if that fails, l is left as it was and
// the error is an *errStateWrite. The one exception is a file written whose
// directory could not be synced (daemon.ErrNotDurable): s is then in force, as the
// file is, and the error says so.
func (c *control) commit(l *blacklist.List, s *blacklist.Set) error {
	return c.commitAs(l, s, l.Replace)
}

// commitAs is commit, with swap putting the set in force (Replace, or ReplaceDelta
// for the result of a delta, so the update is counted as what it was).
func (c *control) commitAs(l *blacklist.List, s *blacklist.Set, swap func(*blacklist.Set)) error {
	dir := c.cfg.StateDir
	if dir == "" {
		swap(s)
		return nil
	}
	s = unexpired(s, time.Now())
	path := statePath(dir, l.Name())
	h := sha256.New()
	err := daemon.WriteFileAtomic(path, 0o600, func(w io.Writer) error {
		return blacklist.WriteBinary(io.MultiWriter(w, h), s)
	})
	if err != nil && !errors.Is(err, daemon.ErrNotDurable) {
		return &errStateWrite{err}
	}
	swap(s)
	src := listSource{state: path}
	h.Sum(src.digest[:0])
	c.setSource(l.Name(), src)
	if err != nil {
		return &errStateWrite{fmt.Errorf("the list is in force and in its state file, which may not survive a power loss: %w", err)}
	}
	return nil
}

// unexpired returns s without the entries expired at now (s itself when it has none).
func unexpired(s *blacklist.Set, now time.Time) *blacklist.Set {
	if s.Stats().Expiring == 0 {
		return s
	}
	expired := func(e blacklist.Entry) bool { return !e.Expires.IsZero() && !now.Before(e.Expires) }
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
	var b blacklist.Builder
	for e := range s.All() {
		b.Add(e.Prefix, e.Expires)
	}
	return b.BuildAt(now)
}

// dropState takes list l back to its configured files (empty without any), removing
// its state file first when there is a state_dir. A file that cannot be read, or a
// state file that cannot be removed, changes nothing.
func (c *control) dropState(l *blacklist.List) error {
	name := l.Name()
	var set *blacklist.Set
	var src listSource
	if files := c.cfg.Blacklists[name].Files; len(files) > 0 {
		data, s, err := readListFiles(name, files)
		if err == nil {
			set, err = parseListFiles(name, files, data)
		}
		if err != nil {
			return err
		}
		src = s
	}
	if dir := c.cfg.StateDir; dir != "" {
		if err := daemon.RemoveFileDurably(statePath(dir, name)); err != nil {
			return &errStateWrite{err}
		}
	}
	l.Replace(set)
	c.setSource(name, src)
	return nil
}

// prepareStateDir creates dir if needed, removes the temporary files a crash may
// have left in it, checks that it is writable, and warns of state files that belong
// to no list in names.
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
