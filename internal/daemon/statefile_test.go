package daemon

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// entries lists a directory's names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.bin")
	write := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}

	if err := WriteFileAtomic(path, 0o640, write("one")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "one" {
		t.Errorf("content %q", b)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("mode: %v %v", fi.Mode(), err)
	}
	if err := WriteFileAtomic(path, 0o600, write("two")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Errorf("replaced content %q", b)
	}

	// A failing writer leaves the old file and no temporary file.
	boom := errors.New("boom")
	err := WriteFileAtomic(path, 0o600, func(w io.Writer) error {
		io.WriteString(w, "partial")
		return boom
	})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), path) || errors.Is(err, ErrNotDurable) {
		t.Errorf("failing writer: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Errorf("a failed write changed the file: %q", b)
	}
	if names := entries(t, dir); len(names) != 1 || names[0] != "state.bin" {
		t.Errorf("files left: %v", names)
	}

	// A directory that is not one: the error names the file.
	notDir := filepath.Join(dir, "state.bin", "x")
	if err := WriteFileAtomic(notDir, 0o600, write("x")); err == nil || !strings.Contains(err.Error(), notDir) {
		t.Errorf("under a file: %v", err)
	}

	if err := RemoveFileDurably(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("not removed: %v", err)
	}
	if err := RemoveFileDurably(path); err != nil {
		t.Errorf("removing an absent file: %v", err)
	}
	if err := SyncDir(filepath.Join(dir, "missing")); err == nil {
		t.Errorf("syncing a missing directory succeeded")
	}
}

func TestPrepareFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	write := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}
	if err := WriteFileAtomic(path, 0o600, write("old")); err != nil {
		t.Fatal(err)
	}

	// Abort leaves the old file and nothing else.
	p, err := PrepareFile(path, 0o600, write("aborted"))
	if err != nil {
		t.Fatal(err)
	}
	if names := entries(t, dir); len(names) != 2 {
		t.Errorf("prepared: files %v, want the old one and the pending one", names)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("prepare changed the file: %q", b)
	}
	p.Abort()
	if names := entries(t, dir); len(names) != 1 || names[0] != "state.json" {
		t.Errorf("aborted: files left %v", names)
	}

	// Commit puts the new content in place.
	p, err = PrepareFile(path, 0o600, write("new"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "new" {
		t.Errorf("committed content %q", b)
	}

	// A directory sync that fails is reported, never ignored: the content is in
	// place but the error says it is not durable.
	boom := errors.New("EIO")
	var synced []string
	syncDir = func(d string) error { synced = append(synced, d); return boom }
	t.Cleanup(func() { syncDir = SyncDir })
	p, err = PrepareFile(path, 0o600, write("newer"))
	if err != nil {
		t.Fatal(err)
	}
	err = p.Commit()
	if !errors.Is(err, ErrNotDurable) || !errors.Is(err, boom) || !strings.Contains(err.Error(), path) {
		t.Errorf("commit with a failing directory sync: %v, want ErrNotDurable and the cause", err)
	}
	if len(synced) != 1 || filepath.Clean(synced[0]) != dir {
		t.Errorf("synced %v, want %s", synced, dir)
	}
	if b, _ := os.ReadFile(path); string(b) != "newer" {
		t.Errorf("content after a failed directory sync %q", b)
	}
	if err := WriteFileAtomic(path, 0o600, write("x")); !errors.Is(err, ErrNotDurable) {
		t.Errorf("WriteFileAtomic with a failing directory sync: %v", err)
	}
	if err := RemoveFileDurably(path); !errors.Is(err, boom) {
		t.Errorf("RemoveFileDurably with a failing directory sync: %v", err)
	}

	// A rename that fails (the path is a directory) removes the pending file.
	syncDir = SyncDir
	sub := filepath.Join(dir, "sub")
	if err := os.MkdirAll(filepath.Join(sub, "taken"), 0o700); err != nil {
		t.Fatal(err)
	}
	p, err = PrepareFile(filepath.Join(sub, "taken"), 0o600, write("y"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); err == nil || errors.Is(err, ErrNotDurable) {
		t.Errorf("commit over a directory: %v", err)
	}
	if names := entries(t, sub); len(names) != 1 || names[0] != "taken" {
		t.Errorf("failed commit left %v", names)
	}
}
