package l7d

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// writeTicketKey writes a ticket key file at path whose modification time is age ago.
func writeTicketKey(t *testing.T, path string, age time.Duration) {
	t.Helper()
	var k [32]byte
	rand.Read(k[:])
	writeFile(t, path, hex.EncodeToString(k[:])+"\n")
	at := time.Now().Add(-age)
	if err := os.Chtimes(path, at, at); err != nil {
		t.Fatal(err)
	}
}

// metric returns the value of the unlabelled metric name on c's /metrics, or -1 when
// it is absent.
func metric(t *testing.T, c adminClient, name string) float64 {
	t.Helper()
	code, _, body := c.call("GET", "/metrics", "")
	if code != 200 {
		t.Fatalf("GET /metrics: %d", code)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// TestTicketKeyAge: at start and on each reload l7d warns when the newest ticket key
// file is older than certificates.ticket_key_max_age, and reports the newest key's
// age (and the limit) as metrics; a fresh key puts the warning away.
func TestTicketKeyAge(t *testing.T) {
	dir := t.TempDir()
	testCert(t, dir)
	cur, prev := filepath.Join(dir, "current.key"), filepath.Join(dir, "previous.key")
	writeTicketKey(t, cur, 3*time.Hour)
	writeTicketKey(t, prev, 27*time.Hour)
	admin := freeAddr(t)
	config := func(maxAge string) string {
		return `
admin_listen: "` + admin + `"
listeners: [{name: web, addr: "127.0.0.1:0", pool: app, disable_http3: true}]
backends: {app: {members: ["127.0.0.1:9"]}}
certificates:
  certificates: [{name: www, cert_file: ` + filepath.Join(dir, "www.pem") + `, key_file: ` + filepath.Join(dir, "www.key") + `}]
  ticket_key_files: [` + cur + `, ` + prev + `]
` + maxAge
	}
	path := filepath.Join(dir, "l7d.yaml")
	writeFile(t, path, config("  ticket_key_max_age: 1h\n"))
	c, log := runDaemon(t, path, admin)
	const warning = "the newest ticket key is older than ticket_key_max_age"
	if n := strings.Count(log.String(), warning); n != 1 || !strings.Contains(log.String(), "ticket_key_max_age=1h0m0s") {
		t.Errorf("start with a 3h old newest key and a 1h limit: %d warnings\n%s", n, log)
	}
	if age := metric(t, c, "tiergate_l7_ticket_key_age_seconds"); age < (3*time.Hour).Seconds()-60 || age > (3*time.Hour).Seconds()+60 {
		t.Errorf("tiergate_l7_ticket_key_age_seconds %v, want about 3h (the newest of the two)", age)
	}

	// The default limit, 48h: a 3h old key is no warning.
	writeFile(t, path, config(""))
	if code, _, body := c.call("POST", "/reload", ""); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	if n := strings.Count(log.String(), warning); n != 1 {
		t.Errorf("reload with the default limit warned again (%d warnings)\n%s", n, log)
	}
	if v := metric(t, c, "tiergate_l7_ticket_key_max_age_seconds"); v != (48 * time.Hour).Seconds() {
		t.Errorf("tiergate_l7_ticket_key_max_age_seconds %v, want 48h", v)
	}

	// Rotation stopped for three days: the reload warns.
	writeTicketKey(t, cur, 72*time.Hour)
	writeTicketKey(t, prev, 96*time.Hour)
	if code, _, body := c.call("POST", "/reload", ""); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	if n := strings.Count(log.String(), warning); n != 2 || !strings.Contains(log.String(), "ticket_key_max_age=48h0m0s") {
		t.Errorf("reload with 72h old keys: %d warnings\n%s", n, log)
	}
	if age := metric(t, c, "tiergate_l7_ticket_key_age_seconds"); age < (72*time.Hour).Seconds()-60 {
		t.Errorf("tiergate_l7_ticket_key_age_seconds %v after the reload, want about 72h", age)
	}

	// A new key put first: no warning, the age starts again.
	writeTicketKey(t, cur, 0)
	if code, _, body := c.call("POST", "/reload", ""); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	if n := strings.Count(log.String(), warning); n != 2 {
		t.Errorf("reload with a fresh key warned (%d warnings)\n%s", n, log)
	}
	if age := metric(t, c, "tiergate_l7_ticket_key_age_seconds"); age < 0 || age > 60 {
		t.Errorf("tiergate_l7_ticket_key_age_seconds %v after rotation, want about 0", age)
	}
}

// TestTicketKeyAgeWithoutKeys: without ticket_key_files there is no age to report and
// nothing to warn about.
func TestTicketKeyAgeWithoutKeys(t *testing.T) {
	d, _, log := setupDaemon(t, testConfig(t, t.TempDir(), "127.0.0.1:0", ""))
	if n, err := testutil.GatherAndCount(d.Reg, "tiergate_l7_ticket_key_age_seconds"); n != 0 || err != nil {
		t.Errorf("tiergate_l7_ticket_key_age_seconds: %d series (%v) without ticket keys", n, err)
	}
	if strings.Contains(log.String(), "ticket key") {
		t.Errorf("warned about ticket keys without any:\n%s", log)
	}
}
