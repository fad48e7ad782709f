package l7d

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// gzipBomb returns a gzip stream of a few MiB that inflates to head followed by fill
// repeated up to size bytes: the same 1 MiB member over and over, which a gzip
// reader takes as one stream.
func gzipBomb(t *testing.T, head []byte, fill string, size int64) []byte {
	t.Helper()
	member := func(b []byte) []byte {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		zw.Write(b)
		zw.Close()
		return buf.Bytes()
	}
	body := bytes.Repeat([]byte(fill), (1<<20)/len(fill))
	var out bytes.Buffer
	out.Write(member(append(bytes.Clone(head), body[len(head):]...)))
	rest := member(body)
	for n := int64(len(body)); n < size; n += int64(len(body)) {
		out.Write(rest)
	}
	return out.Bytes()
}

func gzipped(s string) string {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write([]byte(s))
	zw.Close()
	return buf.String()
}

// refused reads tiergate_blacklist_uploads_refused_total{reason} from d's registry.
func refused(t *testing.T, d *Daemon, reason string) float64 {
	t.Helper()
	n, err := testutil.GatherAndCount(d.Reg, "tiergate_blacklist_uploads_refused_total")
	if err != nil || n == 0 {
		t.Fatalf("tiergate_blacklist_uploads_refused_total not registered: %v", err)
	}
	mfs, _ := d.Reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "tiergate_blacklist_uploads_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestAdminUploadGzipBomb: a blacklist upload that is a small gzip inflating to 1 GiB
// is answered 413, code too_large, naming the limit it passed, with the default
// limits; the list in force stays, and the whole process allocates a few MiB for it.
// (Before the limits, the text bomb was read to its end and taken, and the binary
// one read whole into memory.)
func TestAdminUploadGzipBomb(t *testing.T) {
	if testing.Short() {
		t.Skip("inflates up to 512 MiB")
	}
	dir := t.TempDir()
	d, c, _ := setupDaemon(t, testConfig(t, dir, "127.0.0.1:0", ""))
	if code, _, body := c.call("PUT", "/blacklists/global", "192.0.2.1\n"); code != 200 {
		t.Fatalf("a good upload: %d %s", code, body)
	}
	comment := "#" + strings.Repeat(" nothing to see here", 50) + "\n"
	claim := append([]byte("\x89TGBL\r\n\x1a\x00\x01\x00\x00"), binary.AppendUvarint(nil, 1<<40)...)
	const size = 1 << 30
	for _, tt := range []struct {
		name, method, path, limit string
		bomb                      []byte
	}{
		{"text", "PUT", "/blacklists/global", "max_text_bytes", gzipBomb(t, nil, comment, size)},
		{"delta", "POST", "/blacklists/global/delta", "max_text_bytes", gzipBomb(t, nil, comment, size)},
		{"binary", "PUT", "/blacklists/web", "max_entries", gzipBomb(t, claim, "\x00", size)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bomb := string(tt.bomb)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			code, out, body := c.call(tt.method, tt.path, bomb)
			runtime.ReadMemStats(&after)
			if code != http.StatusRequestEntityTooLarge || out["code"] != "too_large" || out["limit"] != "admin_blacklist_uploads."+tt.limit {
				t.Fatalf("a %d-byte gzip of 1 GiB: %d %s; want 413 too_large on %s", len(tt.bomb), code, body, tt.limit)
			}
			if !strings.Contains(out["message"].(string), tt.limit) {
				t.Errorf("message %q does not name %s", out["message"], tt.limit)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
				t.Errorf("the upload allocated %d MiB, want under 64", alloc>>20)
			}
		})
	}
	if !has(d.lists.Global().Snapshot(), "192.0.2.1") || d.lists.Global().Snapshot().Len() != 1 {
		t.Error("a refused upload changed the list")
	}
	if got := refused(t, d, "max_text_bytes"); got != 2 {
		t.Errorf("refused{reason=max_text_bytes} = %v, want 2", got)
	}
	if got := refused(t, d, "max_entries"); got != 1 {
		t.Errorf("refused{reason=max_entries} = %v, want 1", got)
	}
}

// TestAdminUploadLimitsConfigured: admin_blacklist_uploads sets the limits; an upload
// over one is answered 413 naming it, one within them is taken.
func TestAdminUploadLimitsConfigured(t *testing.T) {
	dir := t.TempDir()
	d, c, _ := setupDaemon(t, testConfig(t, dir, "127.0.0.1:0",
		"admin_blacklist_uploads: {max_body_bytes: 1000, max_text_bytes: 2000, max_entries: 3}\n"))
	if l := d.current().AdminBlacklistUploads; l.MaxBinaryBytes != 128<<20 || l.Wait.D() != 5*time.Second {
		t.Errorf("defaults of the limits not given: %+v", l)
	}
	for _, tt := range []struct {
		name, method, path, body, limit string
	}{
		{"body", "PUT", "/blacklists/global", strings.Repeat("#", 1001), "max_body_bytes"},
		{"text", "PUT", "/blacklists/global", gzipped(strings.Repeat("#", 2001)), "max_text_bytes"},
		{"entries", "PUT", "/blacklists/global", "192.0.2.1\n192.0.2.3\n192.0.2.5\n192.0.2.7\n", "max_entries"},
		{"delta entries", "POST", "/blacklists/global/delta", "+192.0.2.1\n+192.0.2.3\n-192.0.2.5\n+192.0.2.7\n", "max_entries"},
	} {
		code, out, body := c.call(tt.method, tt.path, tt.body)
		if code != 413 || out["code"] != "too_large" || out["limit"] != "admin_blacklist_uploads."+tt.limit {
			t.Errorf("%s: %d %s; want 413 too_large on %s", tt.name, code, body, tt.limit)
		}
	}
	if code, out, body := c.call("PUT", "/blacklists/global", "192.0.2.1\n192.0.2.3\n192.0.2.5\n"); code != 200 || out["entries"] != 3.0 {
		t.Errorf("an upload within the limits: %d %s", code, body)
	}
	if _, err := ParseConfig([]byte(minimal+"admin_blacklist_uploads: {max_entries: -1}\n"), "t"); err == nil ||
		!strings.Contains(err.Error(), "admin_blacklist_uploads.max_entries") {
		t.Errorf("a negative limit: %v", err)
	}
}

// TestAdminUploadsOneAtATime: while an upload is being read, another waits for it at
// most the limits' wait, then is answered 429, code busy, with Retry-After; once the
// first is done, the next is taken.
func TestAdminUploadsOneAtATime(t *testing.T) {
	dir := t.TempDir()
	d, c, _ := setupDaemon(t, testConfig(t, dir, "127.0.0.1:0", "admin_blacklist_uploads: {wait: 100ms}\n"))

	// The first upload: its headers, then half its body, then nothing until later.
	first := "192.0.2.1\n192.0.2.3\n"
	addr := strings.TrimPrefix(c.base, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT /blacklists/global HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", addr, c.token, len(first), first[:10])

	// Another is refused as busy once the first holds the slot.
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, _ := http.NewRequest("PUT", c.base+"/blacklists/web", strings.NewReader("198.51.100.1\n"))
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			if resp.Header.Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
			break
		}
		if resp.StatusCode != 200 || time.Now().After(deadline) {
			t.Fatalf("a second upload while the first is read: %d", resp.StatusCode)
		}
		time.Sleep(10 * time.Millisecond) // the first was not read yet
	}
	if got := refused(t, d, "busy"); got < 1 {
		t.Errorf("refused{reason=busy} = %v", got)
	}

	// The first ends and is taken; the next upload is read at once.
	fmt.Fprint(conn, first[10:])
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || d.lists.Global().Snapshot().Len() != 2 {
		t.Errorf("the first upload: %d, %d entries", resp.StatusCode, d.lists.Global().Snapshot().Len())
	}
	if code, _, body := c.call("POST", "/blacklists/web/delta", "+198.51.100.9\n"); code != 200 {
		t.Errorf("an upload after the first: %d %s", code, body)
	}
}
