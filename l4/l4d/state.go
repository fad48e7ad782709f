package l4d

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// readState reads a state file: the forwarding configuration as JSON, the body of
// GET /config. A missing file is reported as os.ErrNotExist.
func readState(path string) (Forwarding, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Forwarding{}, fmt.Errorf("reading state file: %w", err)
	}
	var f Forwarding
	if err := decodeJSON(bytes.NewReader(data), &f); err != nil {
		return Forwarding{}, fmt.Errorf("state file %s: %w", path, err)
	}
	return f, nil
}

// decodeJSON decodes exactly one JSON value into v, refusing unknown fields.
func decodeJSON(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("data after the JSON value")
	}
	return nil
}

// stateWrite is a state file written but not yet in place: commit renames it over
// the state file, abort removes it. Splitting the two lets a change be written
// before it is applied, and put in place only once the datapath took it.
type stateWrite struct {
	tmp, path string
}

// prepareState writes f to a temporary file beside path and syncs it.
func prepareState(path string, f Forwarding) (*stateWrite, error) {
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the state: %w", err)
	}
	data = append(data, '\n')
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return nil, fmt.Errorf("writing state file: %w", err)
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("writing state file: %w", err)
	}
	return &stateWrite{tmp: tmp.Name(), path: path}, nil
}

// commit puts the written state in place atomically and syncs the directory.
func (w *stateWrite) commit() error {
	if err := os.Rename(w.tmp, w.path); err != nil {
		os.Remove(w.tmp)
		return fmt.Errorf("writing state file: %w", err)
	}
	if dir, err := os.Open(filepath.Dir(w.path)); err == nil {
		dir.Sync()
		dir.Close()
	}
	return nil
}

// abort removes the written state.
func (w *stateWrite) abort() { os.Remove(w.tmp) }
