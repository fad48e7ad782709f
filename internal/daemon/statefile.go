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
// loss may still undo. perm is the new file's mode.
func WriteFileAtomic(path string, perm os.FileMode, write func(io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+TempSuffix+"*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
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
		return err
	}
	bw := bufio.NewWriterSize(f, 256<<10)
	if err := write(bw); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	return nil
}

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
	if err := SyncDir(filepath.Dir(path)); err != nil {
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
