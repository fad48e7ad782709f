package certs

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func randomKey(t testing.TB) [TicketKeyLen]byte {
	var k [TicketKeyLen]byte
	rand.Read(k[:])
	return k
}

func TestParseTicketKey(t *testing.T) {
	key := randomKey(t)
	hexKey := hex.EncodeToString(key[:])
	tests := []struct {
		name    string
		data    string
		wantErr string
	}{
		{"raw", string(key[:]), ""},
		{"hex", hexKey, ""},
		{"hex with newline", hexKey + "\n", ""},
		{"upper-case hex", strings.ToUpper(hexKey), ""},
		{"base64", base64.StdEncoding.EncodeToString(key[:]) + "\n", ""},
		{"base64 unpadded", base64.RawStdEncoding.EncodeToString(key[:]), ""},
		{"base64 URL", "  " + base64.URLEncoding.EncodeToString(key[:]) + "\r\n", ""},
		{"empty", "", "have 0 bytes"},
		{"raw with a newline", string(key[:]) + "\n", "have 33 bytes"},
		{"short", string(key[:31]), "have 31 bytes"},
		{"not hex", strings.Repeat("zz", 32), "not hex digits"},
		{"base64 of 31 bytes", base64.StdEncoding.EncodeToString(key[:31]), "none of these"},
		{"base64 of 33 bytes", base64.StdEncoding.EncodeToString(append(key[:], 1)), "none of these"},
		{"zeros", strings.Repeat("00", 32), "all zeros"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTicketKey([]byte(tt.data))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != key {
				t.Fatalf("key = %x, want %x", got, key)
			}
		})
	}
}

func TestLoadTicketKeys(t *testing.T) {
	dir := t.TempDir()
	k1, k2 := randomKey(t), randomKey(t)
	f1 := writeFile(t, filepath.Join(dir, "k1"), k1[:])
	f2 := writeFile(t, filepath.Join(dir, "k2"), []byte(hex.EncodeToString(k2[:])+"\n"))
	bad := writeFile(t, filepath.Join(dir, "bad"), []byte("short\n"))
	dup := writeFile(t, filepath.Join(dir, "dup"), []byte(base64.StdEncoding.EncodeToString(k1[:])))

	keys, err := LoadTicketKeys([]string{f2, f1})
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0] != k2 || keys[1] != k1 {
		t.Fatalf("keys out of order: %x", keys)
	}
	if keys, err := LoadTicketKeys(nil); err != nil || len(keys) != 0 {
		t.Fatalf("no files: %x, %v", keys, err)
	}
	for _, tc := range []struct {
		paths []string
		want  string
	}{
		{[]string{f1, bad}, "ticket key file " + bad},
		{[]string{filepath.Join(dir, "missing")}, "no such file"},
		{[]string{f1, dup}, "holds the same key as " + f1},
		{[]string{dir}, "ticket key file " + dir},
	} {
		if _, err := LoadTicketKeys(tc.paths); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadTicketKeys(%v) error = %v, want one containing %q", tc.paths, err, tc.want)
		}
	}
}

func FuzzParseTicketKey(f *testing.F) {
	key := randomKey(f)
	f.Add(key[:])
	f.Add([]byte(hex.EncodeToString(key[:]) + "\n"))
	f.Add([]byte(base64.StdEncoding.EncodeToString(key[:])))
	f.Add([]byte(base64.RawURLEncoding.EncodeToString(key[:]) + " \n"))
	f.Add([]byte(strings.Repeat("0", 64)))
	f.Add([]byte("not a key"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := ParseTicketKey(data)
		if err != nil {
			return
		}
		if k == [TicketKeyLen]byte{} {
			t.Fatal("accepted an all-zero key")
		}
		// Every accepted key reads back the same from its hex form.
		again, err := ParseTicketKey([]byte(hex.EncodeToString(k[:])))
		if err != nil || again != k {
			t.Fatalf("hex round trip: %x, %v", again, err)
		}
	})
}

// TestNewestTicketKeyAge: the age of the most recently written key file, whatever
// its place in the list; a missing file is an error naming it.
func TestNewestTicketKeyAge(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2030, 1, 10, 12, 0, 0, 0, time.UTC)
	var paths []string
	for i, age := range []time.Duration{72 * time.Hour, 5 * time.Hour, 48 * time.Hour} {
		p := filepath.Join(dir, fmt.Sprintf("ticket-%d.key", i))
		if err := os.WriteFile(p, bytes.Repeat([]byte{byte(i + 1)}, TicketKeyLen), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	if age, err := NewestTicketKeyAge(paths, now); err != nil || age != 5*time.Hour {
		t.Errorf("age %v, %v; want 5h", age, err)
	}
	if age, err := NewestTicketKeyAge(paths[:1], now); err != nil || age != 72*time.Hour {
		t.Errorf("one file: %v, %v; want 72h", age, err)
	}
	if age, err := NewestTicketKeyAge(paths[:1], now.Add(-100*time.Hour)); err != nil || age != 0 {
		t.Errorf("a file from the future: %v, %v; want 0", age, err)
	}
	missing := filepath.Join(dir, "missing.key")
	if _, err := NewestTicketKeyAge(append(paths, missing), now); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := NewestTicketKeyAge(nil, now); err == nil {
		t.Errorf("no files: no error")
	}
}
