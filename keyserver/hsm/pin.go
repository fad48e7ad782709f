package hsm

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// ErrNoPIN is returned by New when the token needs a login and no PIN source is
// configured.
var ErrNoPIN = errors.New("no user PIN configured (set pin_file, pin_env, pin, or pin-source in a pkcs11: URI)")

// maxPINFile bounds what is read from a PIN file.
const maxPINFile = 4 << 10

// resolvePIN returns the user PIN from the first configured source: cfg.PINFile,
// cfg.PINEnv or cfg.PIN (at most one of them may be set), else the pin-source or
// pin-value of the first URI in uris that has one. It returns ErrNoPIN when nothing
// is configured.
func resolvePIN(cfg *Config, uris []*URI) (string, error) {
	set := 0
	for _, s := range []string{cfg.PINFile, cfg.PINEnv, cfg.PIN} {
		if s != "" {
			set++
		}
	}
	if set > 1 {
		return "", errors.New("pin_file, pin_env and pin are mutually exclusive")
	}
	switch {
	case cfg.PINFile != "":
		return readPINFile(cfg.PINFile)
	case cfg.PINEnv != "":
		pin, ok := os.LookupEnv(cfg.PINEnv)
		if !ok {
			return "", fmt.Errorf("PIN environment variable %s is not set", cfg.PINEnv)
		}
		if pin == "" {
			return "", fmt.Errorf("PIN environment variable %s is empty", cfg.PINEnv)
		}
		return pin, nil
	case cfg.PIN != "":
		return cfg.PIN, nil
	}
	for _, u := range uris {
		switch {
		case u.PINSource != "":
			return pinFromSource(u.PINSource)
		case u.PINValue != "":
			return u.PINValue, nil
		}
	}
	return "", ErrNoPIN
}

// pinFromSource reads an RFC 7512 pin-source: "file:" followed by a path or file URI
// path, or a bare path. Programs ("|cmd") are not run.
func pinFromSource(src string) (string, error) {
	switch {
	case strings.HasPrefix(src, "|"):
		return "", fmt.Errorf("pin-source %q: running a program for the PIN is not supported; use a file", src)
	case strings.HasPrefix(src, "file://"):
		// file:///etc/pin (empty authority) or file://localhost/etc/pin.
		rest := strings.TrimPrefix(src, "file://")
		rest = strings.TrimPrefix(rest, "localhost")
		if !strings.HasPrefix(rest, "/") {
			return "", fmt.Errorf("pin-source %q: only local files are supported", src)
		}
		return readPINFile(rest)
	case strings.HasPrefix(src, "file:"):
		return readPINFile(strings.TrimPrefix(src, "file:"))
	}
	return readPINFile(src)
}

// readPINFile returns the file's content without its trailing line ending.
func readPINFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("reading PIN file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPINFile+1))
	if err != nil {
		return "", fmt.Errorf("reading PIN file %s: %w", path, err)
	}
	if len(b) > maxPINFile {
		return "", fmt.Errorf("PIN file %s is larger than %d bytes", path, maxPINFile)
	}
	pin := strings.TrimRight(string(b), "\r\n")
	if pin == "" {
		return "", fmt.Errorf("PIN file %s is empty", path)
	}
	return pin, nil
}
