package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// TestDecisionsPush pushes CrowdSec's decision shape to POST
// /v1/blacklists/{name}/decisions and reads the list back from the store.
func TestDecisionsPush(t *testing.T) {
	f := newFixture(t)
	risk := f.token(t, "engine", RoleRiskEngine)
	viewer := f.token(t, "viewer", RoleViewer)
	wr := blsync.NewWriter(f.st, blsync.WriterConfig{})
	read := func() (*blacklist.Set, int64) {
		t.Helper()
		s, m, err := wr.Read(context.Background(), "risk")
		if err != nil {
			t.Fatal(err)
		}
		return s, m.Version
	}
	result := func(a answer) DecisionsResult {
		t.Helper()
		if a.status != http.StatusOK {
			t.Fatalf("push: %d %s", a.status, a.body)
		}
		var r DecisionsResult
		if err := json.Unmarshal(a.body, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	const path = "/v1/blacklists/risk/decisions"
	has := func(s *blacklist.Set, a string) bool { return s.Contains(netip.MustParseAddr(a)) }

	// As CrowdSec's Local API streams them: ban decisions of scope Ip and
	// Range taken, a captcha and a Country skipped and counted.
	r := result(f.do(t, risk, "POST", path, `{"new":[
		{"id":1,"value":"198.51.100.7","scope":"Ip","type":"ban","duration":"3h59m58s","origin":"crowdsec","scenario":"crowdsecurity/ssh-bf"},
		{"id":2,"value":"203.0.113.0/24","scope":"Range","type":"ban","origin":"lists","scenario":"x"},
		{"id":3,"value":"198.51.100.20","scope":"Ip","type":"captcha","duration":"1h"},
		{"id":4,"value":"FR","scope":"Country","type":"ban","duration":"1h"}],"deleted":null}`))
	if r.State != "stored" || r.Added != 2 || r.Removed != 0 || r.Skipped["type"] != 1 || r.Skipped["scope"] != 1 || r.Operation == "" {
		t.Fatalf("first push: %+v", r)
	}
	s, v := read()
	if v != r.Version || !has(s, "198.51.100.7") || !has(s, "203.0.113.9") || has(s, "198.51.100.20") {
		t.Fatalf("after the first push (version %d, answered %d): .7 %v, 203.0.113.9 %v, .20 %v", v, r.Version,
			has(s, "198.51.100.7"), has(s, "203.0.113.9"), has(s, "198.51.100.20"))
	}
	for e := range s.All() {
		if e.Prefix.String() == "198.51.100.7/32" {
			if left := time.Until(e.Expires); left < 3*time.Hour+59*time.Minute || left > 4*time.Hour {
				t.Errorf("a decision of 3h59m58s ends in %v", left)
			}
		}
	}

	// An array of new decisions; then a deletion.
	r = result(f.do(t, risk, "POST", path, `[{"value":"2001:db8::7","scope":"Ip","type":"ban","duration":"1m"}]`))
	if r.Added != 1 {
		t.Fatalf("an array: %+v", r)
	}
	r = result(f.do(t, f.admin, "POST", path, `{"deleted":[{"id":1,"value":"198.51.100.7","scope":"Ip","type":"ban","duration":"-1s"}]}`))
	if r.Removed != 1 || r.Added != 0 {
		t.Fatalf("a deletion: %+v", r)
	}
	s, v = read()
	if has(s, "198.51.100.7") || !has(s, "2001:db8::7") || !has(s, "203.0.113.9") || v != r.Version {
		t.Fatalf("after the deletion (version %d, answered %d): 198.51.100.7 still listed, or the others gone", v, r.Version)
	}

	// ?types= enforces other types.
	r = result(f.do(t, risk, "POST", path+"?types=ban,captcha", `[{"value":"198.51.100.20","scope":"Ip","type":"captcha"}]`))
	if r.Added != 1 {
		t.Fatalf("types=ban,captcha: %+v", r)
	}
	s, v = read()
	if !has(s, "198.51.100.20") {
		t.Fatal("types=ban,captcha: the captcha decision not listed")
	}

	// Every decision skipped: nothing written.
	r = result(f.do(t, risk, "POST", path, `[{"value":"198.51.100.21","scope":"Ip","type":"captcha"}]`))
	if r.State != "unchanged" || r.Version != v || r.Skipped["type"] != 1 {
		t.Fatalf("all skipped: %+v (version %d)", r, v)
	}

	// Refusals, nothing changed.
	a := f.do(t, risk, "POST", path, `{"new":[{"value":"198.51.100.8","scope":"Ip","type":"ban"},{"value":"198.51.100.0/24","scope":"Ip","type":"ban"},{"value":"1.2.3.4","scope":"Ip","duration":"soon"}]}`)
	if a.status != http.StatusUnprocessableEntity || a.err.Code != CodeInvalid || len(a.err.Errors) != 2 ||
		a.err.Errors[0].Path != "new[1].value" || a.err.Errors[1].Path != "new[2].duration" {
		t.Errorf("bad values: %d %s", a.status, a.body)
	}
	if a := f.do(t, risk, "POST", path, `{"new":[{"value":7}]}`); a.status != http.StatusBadRequest {
		t.Errorf("a body that does not decode: %d %s", a.status, a.body)
	}
	if a := f.do(t, viewer, "POST", path, `[]`); a.status != http.StatusForbidden {
		t.Errorf("a viewer's push: %d %s", a.status, a.body)
	}
	if a := f.do(t, risk, "POST", "/v1/blacklists/a%20b/decisions", `[]`); a.status != http.StatusBadRequest {
		t.Errorf("a bad list name: %d %s", a.status, a.body)
	}
	if _, v2 := read(); v2 != v {
		t.Errorf("refused pushes changed the list: version %d, was %d", v2, v)
	}

	// An Idempotency-Key makes a retried push one write.
	body := `[{"value":"198.51.100.9","scope":"Ip","type":"ban","duration":"1h"}]`
	first := f.do(t, risk, "POST", path, body, "Idempotency-Key", "k1")
	again := f.do(t, risk, "POST", path, body, "Idempotency-Key", "k1")
	var r1, r2 DecisionsResult
	json.Unmarshal(first.body, &r1)
	json.Unmarshal(again.body, &r2)
	if again.status != http.StatusOK || again.header.Get("Idempotent-Replayed") != "true" || r1.Operation == "" || r2.Operation != r1.Operation || r2.Version != r1.Version {
		t.Errorf("a push retried with its Idempotency-Key: %d %q %s (first %s)", again.status, again.header.Get("Idempotent-Replayed"), again.body, first.body)
	}
	if _, v2 := read(); v2 != v+1 {
		t.Errorf("a push and its retry: version %d, want %d", v2, v+1)
	}
}
