package blacklist

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func writeTestFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func textSet(t *testing.T, text string) *Set {
	t.Helper()
	s, err := ParseText(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStorePrepare: the lists are read from their files, whole or gzip, merged;
// unchanged files are not parsed again (what was pushed stays); a list whose files
// are gone is emptied; a bad file fails the whole, naming the list, the file and the
// line.
func TestStorePrepare(t *testing.T) {
	dir := t.TempDir()
	g1, g2, l1 := filepath.Join(dir, "g1.txt"), filepath.Join(dir, "g2.txt.gz"), filepath.Join(dir, "l1.txt")
	writeTestFile(t, g1, "192.0.2.1\n")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, "# from the risk engine\n198.51.100.0/24\n")
	zw.Close()
	writeTestFile(t, g2, gz.String())
	writeTestFile(t, l1, "203.0.113.5\n")
	cfg := map[string]ListConfig{
		"global": {Files: []string{g1, g2}},
		"web":    {Files: []string{l1}},
		"api":    {Action: ActionClose}, // no files: pushes only
	}
	names := []string{"api", "global", "web"}
	lists := NewLists(Options{})
	st := NewStore(lists, "", quietLog())

	p, err := st.Prepare(cfg, names)
	if err != nil {
		t.Fatal(err)
	}
	g := p.sets["global"]
	if len(p.sets) != 2 || g == nil || !g.Contains(netip.MustParseAddr("192.0.2.1")) || !g.Contains(netip.MustParseAddr("198.51.100.77")) ||
		p.sets["web"].Len() != 1 || len(p.sources) != 2 {
		t.Fatalf("first load: %v sets, sources %v", p.sets, p.sources)
	}
	if lists.Global().Len() != 0 || st.Source("global").Files != nil {
		t.Fatal("Prepare changed the lists")
	}
	st.Commit(p)
	if lists.Global().Len() != 2 || lists.Listener("web").Len() != 1 || len(st.Source("global").Files) != 2 {
		t.Fatalf("Commit: global %d, web %d, source %+v", lists.Global().Len(), lists.Listener("web").Len(), st.Source("global"))
	}

	// Unchanged files are not read again into a set: what was pushed stays.
	if err := st.Replace(lists.Global(), textSet(t, "203.0.113.99\n")); err != nil {
		t.Fatal(err)
	}
	p, err = st.Prepare(cfg, names)
	if err != nil || len(p.sets) != 0 || len(p.sources) != 2 {
		t.Errorf("unchanged: %v %v", p.sets, err)
	}
	st.Commit(p)
	if !lists.Global().Contains(netip.MustParseAddr("203.0.113.99")) {
		t.Errorf("a reload of unchanged files lost the push")
	}

	// One file changed: that list only; a list whose files are gone is emptied.
	writeTestFile(t, l1, "203.0.113.5\n203.0.113.6\n")
	delete(cfg, "global")
	p, err = st.Prepare(cfg, names)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := p.sets["global"]; !ok || s != nil || p.sets["web"].Len() != 2 || len(p.sets) != 2 || len(p.sources) != 1 {
		t.Errorf("after changes: %v, sources %v", p.sets, p.sources)
	}
	st.Commit(p)
	if lists.Global().Len() != 0 || st.Source("global").Files != nil {
		t.Errorf("a list with no files left is not emptied")
	}

	// A bad line fails the whole, naming the list, the file and the line.
	writeTestFile(t, l1, "203.0.113.5\nnot-an-address\n")
	if _, err := st.Prepare(cfg, names); err == nil || !strings.Contains(err.Error(), "blacklists.web: "+l1+": ") ||
		!strings.Contains(err.Error(), "line 2") {
		t.Errorf("bad line: %v", err)
	}
	cfg["web"] = ListConfig{Files: []string{filepath.Join(dir, "missing")}}
	if _, err := st.Prepare(cfg, names); err == nil || !strings.Contains(err.Error(), "blacklists.web") {
		t.Errorf("missing file: %v", err)
	}
	if lists.Listener("web").Len() != 2 {
		t.Errorf("a failed Prepare changed a list")
	}
}

// TestStoreState: with a state directory, a push is written before it is in force; a
// new Store on the directory loads the list from it; Drop goes back to the files.
func TestStoreState(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	files := filepath.Join(dir, "global.txt")
	writeTestFile(t, files, "192.0.2.1\n")
	cfg := map[string]ListConfig{"global": {Files: []string{files}}}
	names := []string{"global"}
	open := func() (*Lists, *Store) {
		lists := NewLists(Options{})
		st := NewStore(lists, stateDir, quietLog())
		if err := st.PrepareDir(names); err != nil {
			t.Fatal(err)
		}
		p, err := st.Prepare(cfg, names)
		if err != nil {
			t.Fatal(err)
		}
		st.Commit(p)
		return lists, st
	}
	lists, st := open()
	g := lists.Global()
	if err := st.Apply(g, &Delta{Add: []Entry{{Prefix: netip.MustParsePrefix("198.51.100.7/32")}}}); err != nil {
		t.Fatal(err)
	}
	if st.Source("global").StateFile != StatePath(stateDir, "global") || g.Len() != 2 {
		t.Fatalf("after a delta: %+v, %d entries", st.Source("global"), g.Len())
	}
	lists2, _ := open()
	if lists2.Global().Len() != 2 || !lists2.Global().Contains(netip.MustParseAddr("198.51.100.7")) {
		t.Errorf("a new Store did not load the pushed state: %d entries", lists2.Global().Len())
	}
	if err := st.Drop(g); err != nil || g.Len() != 1 || st.Source("global").StateFile != "" {
		t.Errorf("Drop: %v, %d entries, %+v", err, g.Len(), st.Source("global"))
	}
	if _, err := os.Stat(StatePath(stateDir, "global")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file left after Drop: %v", err)
	}

	// An unusable directory: the push is refused and changes nothing.
	os.RemoveAll(stateDir)
	writeTestFile(t, stateDir, "not a directory\n")
	before := g.Snapshot()
	var sw *StateWriteError
	if err := st.Replace(g, textSet(t, "203.0.113.1\n")); !errors.As(err, &sw) || g.Snapshot() != before {
		t.Errorf("Replace into an unusable state directory: %v", err)
	}
}

// TestStorePrepareDir: leftover temporary files go, an unusable directory fails.
func TestStorePrepareDir(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "a", "state")
	st := NewStore(NewLists(Options{}), stateDir, quietLog())
	if err := st.PrepareDir([]string{"global"}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(stateDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state_dir not created 0700: %v %v", fi, err)
	}
	left := filepath.Join(stateDir, ".blacklist-global.bin.tmp-123")
	writeTestFile(t, left, "partial")
	writeTestFile(t, filepath.Join(stateDir, "blacklist-gone.bin"), "x")
	if err := st.PrepareDir([]string{"global"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(stateDir, "blacklist-gone.bin")); err != nil {
		t.Errorf("a state file of no list was removed: %v", err)
	}
	notDir := filepath.Join(dir, "file")
	writeTestFile(t, notDir, "x")
	if err := NewStore(nil, notDir, nil).PrepareDir(nil); err == nil || !strings.Contains(err.Error(), "state_dir") {
		t.Errorf("a file as state_dir: %v", err)
	}
	if err := NewStore(nil, "", nil).PrepareDir(nil); err != nil {
		t.Errorf("no state directory: %v", err)
	}
}

// TestUnexpired: entries expired by the time a list is written are left out.
func TestUnexpired(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	var b Builder
	b.AddAddr(netip.MustParseAddr("192.0.2.1"), time.Time{})
	b.AddAddr(netip.MustParseAddr("192.0.2.2"), now.Add(10*time.Second))
	b.Add(netip.MustParsePrefix("2001:db8::/64"), now.Add(time.Hour))
	s := b.BuildAt(now)
	if got := Unexpired(s, now); got != s {
		t.Errorf("nothing expired, yet the set was rebuilt")
	}
	later := Unexpired(s, now.Add(10*time.Second))
	if later.Len() != 2 || !later.ContainsAt(netip.MustParseAddr("192.0.2.1"), now) || later.ContainsAt(netip.MustParseAddr("192.0.2.2"), now) ||
		!later.ContainsAt(netip.MustParseAddr("2001:db8::5"), now) {
		t.Errorf("at expiry: %d entries", later.Len())
	}
	perm := textSet(t, "192.0.2.1\n")
	if Unexpired(perm, now.Add(time.Hour)) != perm {
		t.Errorf("a permanent set was rebuilt")
	}
}

// BenchmarkStoreReplace measures what a state directory adds to a push: writing a
// list of random IPv4 addresses to its state file (binary, fsync, rename, directory
// fsync) and swapping it in.
func BenchmarkStoreReplace(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			var bl Builder
			r := rand.New(rand.NewPCG(1, 2))
			for range n {
				var a [4]byte
				binary.BigEndian.PutUint32(a[:], r.Uint32())
				bl.AddAddr(netip.AddrFrom4(a), time.Time{})
			}
			s := bl.Build()
			lists := NewLists(Options{})
			st := NewStore(lists, b.TempDir(), quietLog())
			l := lists.Global()
			b.ReportAllocs()
			for b.Loop() {
				if err := st.Replace(l, s); err != nil {
					b.Fatal(err)
				}
			}
			fi, err := os.Stat(StatePath(st.Dir(), "global"))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(fi.Size())/float64(s.Len()), "file-B/entry")
		})
	}
}
