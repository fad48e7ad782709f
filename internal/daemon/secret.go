package daemon

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
)

// ExposedMode returns the permission bits of the file at path and whether its
// group or others may read or write it (mode & 0o077): a secret kept there (a
// private key, a PIN, a token) is then not only its owner's.
func ExposedMode(path string) (fs.FileMode, bool, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, false, err
	}
	perm := fi.Mode().Perm()
	return perm, perm&0o077 != 0, nil
}

// WarnIfExposed logs a warning when the file at path, which holds what (e.g. "the
// admin token"), may be read or written by its group or others, and reports whether
// it did. A file that cannot be examined is not warned about: reading it will say why.
func WarnIfExposed(log *slog.Logger, what, path string) bool {
	perm, exposed, err := ExposedMode(path)
	if err != nil || !exposed {
		return false
	}
	if log != nil {
		log.Warn("a secret file is readable by others than its owner: chmod 0600 it (or 0640 for a group that must read it)",
			"holds", what, "file", path, "mode", perm.String())
	}
	return true
}

// StateRoot is where a daemon keeps its state unless configured otherwise:
// StateRoot/<daemon> (systemd's StateDirectory=tiergate/<daemon>).
const StateRoot = "/var/lib/tiergate"

// DefaultStateDir is StateRoot/name, the state directory of the daemon name when
// none is configured.
func DefaultStateDir(name string) string { return filepath.Join(StateRoot, name) }

// GeneratedTokenFile is the name of the admin token a daemon generates in its state
// directory when no admin_token_file is configured.
const GeneratedTokenFile = "admin.token"

// AdminToken returns an admin endpoint's bearer token and the file it came from.
//
//   - file set (admin_token_file): the token is read from it (ReadAdminTokenFile); it
//     must exist.
//   - else insecure (admin_insecure): no token (nil, ""): the endpoint is open to
//     whoever reaches it.
//   - else: the token in stateDir/admin.token, generated when missing: 32 random
//     bytes in hex, written with mode 0600 in a directory created with 0700, and
//     logged with its path (never its value).
//
// A token file readable by its group or others is logged as a warning.
func AdminToken(file string, insecure bool, stateDir string, log *slog.Logger) (tok []byte, path string, err error) {
	if file != "" {
		tok, err := ReadAdminTokenFile(file)
		if err != nil {
			return nil, "", err
		}
		WarnIfExposed(log, "the admin token", file)
		return tok, file, nil
	}
	if insecure {
		return nil, "", nil
	}
	if stateDir == "" {
		return nil, "", errors.New("admin token: no admin_token_file, no state directory to generate one in, and admin_insecure not set")
	}
	path = filepath.Join(stateDir, GeneratedTokenFile)
	tok, err = ReadTokenFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if tok, err = generateToken(path); err == nil {
			if log != nil {
				log.Info("admin token generated: send it as \"Authorization: Bearer <token>\" (or set admin_token_file)", "file", path)
			}
			return tok, path, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, "", fmt.Errorf("generating the admin token: %w", err)
		}
		tok, err = ReadTokenFile(path) // made by another process in between
	}
	if err != nil {
		return nil, "", fmt.Errorf("admin token (generated; remove the file to have a new one made): %w", err)
	}
	WarnIfExposed(log, "the admin token", path)
	return tok, path, nil
}

// generateToken writes a new random token to path, which must not exist, and
// returns it.
func generateToken(path string) ([]byte, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, err
	}
	tok := []byte(hex.EncodeToString(raw[:]))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = f.Write(append(tok, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	return tok, nil
}
