package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// WriteFileAtomic replaces the file at path with what write produces, so that a crash
// at any point leaves either the old file or the new one, whole: write goes to a
// temporary file in the same directory, which is synced, closed, renamed over path,
// and the directory synced so the rename itself is durable. On error the temporary
// file is removed and path is left as it was, except when only the last step fails:
// the error then wraps ErrNotDurable, and path holds the new content, which a power
// loss may still undo. perm is the new file's mode. It is PrepareFile then Commit.
func WriteFileAtomic(path string, perm os.FileMode, write func(io.Writer) error) error {
	p, err := PrepareFile(path, perm, write)
	if err != nil {
		return err
	}
	return p.Commit()
}

// PendingFile is a file written and synced beside the path it is for, not yet in
// place: Commit renames it over that path, Abort removes it. Splitting the two lets
// a daemon save a change before it applies it, and put the saved state in place only
// once the change took.
type PendingFile struct {
	tmp, path, dir string
}

// PrepareFile writes what write produces to a temporary file beside path (named
// "."+base(path)+TempSuffix+"<random>"), with mode perm, and syncs and closes it.
// On error nothing is left behind.
func PrepareFile(path string, perm os.FileMode, write func(io.Writer) error) (_ *PendingFile, err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+TempSuffix+"*")
	if err != nil {
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("writing %s: %w", path, err)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return nil, err
	}
	bw := bufio.NewWriterSize(f, 256<<10)
	if err := write(bw); err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return &PendingFile{tmp: tmp, path: path, dir: dir}, nil
}

// Commit renames the pending file over its path and syncs the directory. If the
// rename fails, the pending file is removed and the path left as it was. If only the
// directory sync fails, the error wraps ErrNotDurable: the new content is in place,
// but a power loss may still undo the rename.
func (p *PendingFile) Commit() error {
	if err := os.Rename(p.tmp, p.path); err != nil {
		os.Remove(p.tmp)
		return fmt.Errorf("writing %s: %w", p.path, err)
	}
	if err := syncDir(p.dir); err != nil {
		return fmt.Errorf("writing %s: %w: %w", p.path, ErrNotDurable, err)
	}
	return nil
}

// Abort removes the pending file; the path is left as it was.
func (p *PendingFile) Abort() { os.Remove(p.tmp) }

// syncDir is SyncDir; tests replace it to see a failed sync reported.
var syncDir = SyncDir

// ErrNotDurable reports a file written and renamed into place whose directory could
// not be synced: the new content is visible, but may not survive a power loss.
var ErrNotDurable = errors.New("written, but its directory could not be synced")

// TempSuffix marks the temporary files of WriteFileAtomic: ".<name>" TempSuffix
// "<random>" beside the file written. One left behind by a crash can be removed.
const TempSuffix = ".tmp-"

// RemoveFileDurably removes path, and syncs its directory so the removal survives a
// crash. A file already absent is not an error.
func RemoveFileDurably(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}

// SyncDir flushes a directory's entries (names created, renamed or removed) to disk.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	return nil
}
