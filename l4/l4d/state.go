package l4d

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/tiergate/tiergate/internal/daemon"
)

// readState reads a state file: the forwarding configuration as JSON, the body of
// GET /config. A missing file is reported as os.ErrNotExist.
func readState(path string) (Forwarding, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Forwarding{}, fmt.Errorf("reading state file: %w", err)
	}
	var f Forwarding
	if err := daemon.DecodeJSON(bytes.NewReader(data), &f); err != nil {
		return Forwarding{}, fmt.Errorf("state file %s: %w", path, err)
	}
	return f, nil
}

// prepareState writes f beside the state file at path and syncs it; the
// daemon.PendingFile's Commit puts it in place once the datapath took the change,
// Abort drops it.
func prepareState(path string, f Forwarding) (*daemon.PendingFile, error) {
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the state: %w", err)
	}
	data = append(data, '\n')
	p, err := daemon.PrepareFile(path, 0o600, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("state file: %w", err)
	}
	return p, nil
}
