package certs

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"
)

// TicketKeyLen is the length of a session ticket key.
const TicketKeyLen = 32

// maxTicketKeyFile bounds what is read of a ticket key file.
const maxTicketKeyFile = 1024

// LoadTicketKeys reads session ticket key files (see ParseTicketKey), in order: the
// first key seals new tickets, all of them open tickets. An unreadable or malformed
// file, or the same key in two files, is an error naming the file.
func LoadTicketKeys(paths []string) ([][TicketKeyLen]byte, error) {
	keys := make([][TicketKeyLen]byte, 0, len(paths))
	for _, p := range paths {
		key, err := readTicketKey(p)
		if err != nil {
			return nil, fmt.Errorf("ticket key file %s: %w", p, err)
		}
		if j := slices.Index(keys, key); j >= 0 {
			return nil, fmt.Errorf("ticket key file %s holds the same key as %s", p, paths[j])
		}
		keys = append(keys, key)
	}
	return keys, nil
}

func readTicketKey(path string) ([TicketKeyLen]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return [TicketKeyLen]byte{}, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxTicketKeyFile+1))
	if err != nil {
		return [TicketKeyLen]byte{}, err
	}
	if len(data) > maxTicketKeyFile {
		return [TicketKeyLen]byte{}, fmt.Errorf("larger than %d bytes: not a ticket key", maxTicketKeyFile)
	}
	return ParseTicketKey(data)
}

// ParseTicketKey parses the contents of a ticket key file: exactly 32 raw bytes, or
// 64 hex digits, or the base64 (standard or URL alphabet, padded or not) of 32 bytes;
// text forms may be surrounded by white space. A key of all zeros is refused.
func ParseTicketKey(data []byte) ([TicketKeyLen]byte, error) {
	var key [TicketKeyLen]byte
	switch text := bytes.TrimSpace(data); {
	case len(data) == TicketKeyLen:
		copy(key[:], data)
	case len(text) == 2*TicketKeyLen:
		if _, err := hex.Decode(key[:], text); err != nil {
			return key, fmt.Errorf("64 characters that are not hex digits: %w", err)
		}
	default:
		if !decodeBase64Key(&key, text) {
			return key, fmt.Errorf("want 32 bytes, raw, as 64 hex digits or in base64; have %d bytes that are none of these", len(data))
		}
	}
	if key == [TicketKeyLen]byte{} {
		return key, errors.New("key is all zeros")
	}
	return key, nil
}

func decodeBase64Key(key *[TicketKeyLen]byte, text []byte) bool {
	if len(text) > base64.StdEncoding.EncodedLen(TicketKeyLen) {
		return false
	}
	var buf [TicketKeyLen + 3]byte
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if n, err := enc.Decode(buf[:], text); err == nil && n == TicketKeyLen {
			copy(key[:], buf[:n])
			return true
		}
	}
	return false
}

// ticketState is what seals and opens session tickets: a tls.Config used only for
// its EncryptTicket and DecryptTicket, holding either the configured keys or, with
// none configured, crypto/tls's own random keys, rotated daily.
type ticketState struct {
	cfg  *tls.Config
	keys [][TicketKeyLen]byte // nil: crypto/tls's random keys
}

func newTicketState(keys [][TicketKeyLen]byte) *ticketState {
	t := &ticketState{cfg: &tls.Config{}}
	if len(keys) > 0 {
		t.keys = slices.Clone(keys)
		t.cfg.SetSessionTicketKeys(t.keys)
	}
	return t
}

// sameKeys reports whether t already uses keys, so a reload that keeps the keys keeps
// the state (and, without configured keys, the random keys that sealed earlier
// tickets).
func (t *ticketState) sameKeys(keys [][TicketKeyLen]byte) bool {
	return slices.Equal(t.keys, keys)
}

// NewestTicketKeyAge returns how long ago the newest of the ticket key files at paths
// was written (its modification time), so that a caller can warn when rotation has
// stopped: every key, the newest included, older than the rotation period means no
// new key was put in place. A file that cannot be examined is an error naming it.
func NewestTicketKeyAge(paths []string, now time.Time) (time.Duration, error) {
	if len(paths) == 0 {
		return 0, errors.New("no ticket key files")
	}
	var newest time.Time
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return 0, fmt.Errorf("ticket key file %s: %w", p, err)
		}
		if fi.ModTime().After(newest) {
			newest = fi.ModTime()
		}
	}
	return max(now.Sub(newest), 0), nil
}
