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
