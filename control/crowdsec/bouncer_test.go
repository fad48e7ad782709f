package crowdsec_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/crowdsec"
	"github.com/tiergate/tiergate/control/crowdsec/crowdsectest"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// listSink writes to a blacklist.List, as a node applies what the store holds,
// and counts the writes; fail makes the next write fail.
type listSink struct {
	mu       sync.Mutex
	list     *blacklist.List
	version  int64
	replaces int
	deltas   []*blacklist.Delta
	fail     bool
}

func newListSink() *listSink {
	return &listSink{list: blacklist.NewList("crowdsec", blacklist.Options{})}
}

func (s *listSink) Replace(_ context.Context, name string, set *blacklist.Set, who string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		s.fail = false
		return 0, errors.New("the store is down")
	}
	s.list.Replace(set)
	s.replaces++
	s.version++
	return s.version, nil
}

func (s *listSink) Delta(_ context.Context, name string, d *blacklist.Delta, who string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		s.fail = false
		return 0, errors.New("the store is down")
	}
	if err := s.list.Apply(d); err != nil {
		return 0, err
	}
	s.deltas = append(s.deltas, d)
	s.version++
	return s.version, nil
}

func (s *listSink) writes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replaces + len(s.deltas)
}

// expires returns the expiry of the list's entry holding a, and whether there
// is one.
func (s *listSink) expires(a string) (time.Time, bool) {
	addr := netip.MustParseAddr(a)
	for e := range s.list.Snapshot().All() {
		if e.Prefix.Contains(addr) {
			return e.Expires, true
		}
	}
	return time.Time{}, false
}

func (s *listSink) has(a string) bool { return s.list.Contains(netip.MustParseAddr(a)) }

// TestBouncerWithCrowdSec runs Debian's crowdsec's Local API and keeps a list in
// step with its decisions: the startup list, a decision added, one deleted, an
// expiry carried and lifting the entry with no write, a host deleted inside a
// range still decided, types not enforced skipped, and a failed write followed
// by the whole list again.
func TestBouncerWithCrowdSec(t *testing.T) {
	lapi := crowdsectest.Start(t)
	lapi.Cscli("decisions", "add", "--ip", "198.51.100.7", "-d", "1h", "-R", "test startup")
	lapi.Cscli("decisions", "add", "--range", "203.0.113.0/24", "-d", "2h")
	lapi.Cscli("decisions", "add", "--ip", "2001:db8::5", "-d", "30m")
	lapi.Cscli("decisions", "add", "--ip", "198.51.100.20", "-d", "1h", "-t", "captcha")

	sink := newListSink()
	b, err := crowdsec.New(crowdsec.Config{LAPIURL: lapi.URL, APIKeyFile: lapi.KeyFile}, sink, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	poll := func(what string) {
		t.Helper()
		if err := b.Poll(ctx); err != nil {
			t.Fatalf("%s: %v\ncrowdsec's log:\n%s", what, err, lapi.Log())
		}
	}
	poll("startup")
	if sink.replaces != 1 || len(sink.deltas) != 0 {
		t.Fatalf("startup: %d replaces and %d deltas, want one replace", sink.replaces, len(sink.deltas))
	}
	for _, a := range []string{"198.51.100.7", "203.0.113.77", "2001:db8::5"} {
		if !sink.has(a) {
			t.Errorf("startup: %s not listed", a)
		}
	}
	if sink.has("198.51.100.20") {
		t.Error("startup: a captcha decision is listed (only ban is enforced)")
	}
	if st := b.Stats(); st.Skipped[crowdsec.SkipType] != 1 || st.Listed != 3 || st.Version != 1 {
		t.Errorf("startup stats %+v: want 1 skipped by type, 3 listed, version 1", st)
	}
	if e, _ := sink.expires("203.0.113.1"); time.Until(e) < 2*time.Hour-time.Minute || time.Until(e) > 2*time.Hour+time.Second {
		t.Errorf("startup: the range expires in %v, want its decision's 2h", time.Until(e))
	}

	// Nothing changed: no write.
	poll("a pull with nothing new")
	if sink.writes() != 1 {
		t.Fatalf("a pull with nothing new wrote (%d writes)", sink.writes())
	}

	// An added decision arrives, its duration the entry's expiry.
	lapi.Cscli("decisions", "add", "--ip", "198.51.100.8", "-d", "1m")
	poll("an added decision")
	if !sink.has("198.51.100.8") {
		t.Fatal("an added decision: not listed")
	}
	if e, ok := sink.expires("198.51.100.8"); !ok || time.Until(e) < 50*time.Second || time.Until(e) > 61*time.Second {
		t.Errorf("an added decision of 1m expires in %v, want about 1m", time.Until(e))
	}
	if len(sink.deltas) != 1 || len(sink.deltas[0].Add) != 1 || len(sink.deltas[0].Remove) != 0 {
		t.Errorf("an added decision: deltas %+v, want one of one addition", sink.deltas)
	}

	// A deleted decision is removed, the others stay.
	lapi.Cscli("decisions", "delete", "--ip", "198.51.100.7")
	poll("a deleted decision")
	if sink.has("198.51.100.7") {
		t.Fatal("a deleted decision: still listed")
	}
	for _, a := range []string{"198.51.100.8", "203.0.113.77", "2001:db8::5"} {
		if !sink.has(a) {
			t.Errorf("a deleted decision: %s no longer listed", a)
		}
	}

	// A host decided inside a decided range, then deleted: the range still
	// covers it.
	lapi.Cscli("decisions", "add", "--ip", "203.0.113.5", "-d", "1h")
	poll("a host inside a range")
	lapi.Cscli("decisions", "delete", "--id", lapi.DecisionID("Ip:203.0.113.5"))
	poll("the host inside a range deleted")
	if !sink.has("203.0.113.5") {
		t.Error("a host deleted inside a range still decided: no longer listed")
	}

	// Two decisions on one address: deleting the longer leaves the entry with
	// the shorter one's end.
	lapi.Cscli("decisions", "add", "--ip", "198.51.100.50", "-d", "1h")
	long := lapi.DecisionID("Ip:198.51.100.50")
	poll("a first decision on .50")
	lapi.Cscli("decisions", "add", "--ip", "198.51.100.50", "-d", "10m")
	poll("a second decision on .50")
	if e, _ := sink.expires("198.51.100.50"); time.Until(e) < 59*time.Minute {
		t.Errorf("two decisions on .50, 1h and 10m: the entry ends in %v, want the later", time.Until(e))
	}
	lapi.Cscli("decisions", "delete", "--id", long)
	poll("the longer decision on .50 deleted")
	// crowdsec 1.4.6's stream reports only the longest decision on an address,
	// so the deletion only shows in a pull of every decision: a resync.
	writes := sink.writes()
	if err := b.Resync(ctx); err != nil {
		t.Fatal(err)
	}
	// Expiries are kept to the second, rounded up: the end may be up to a second
	// past the decision's 10m.
	if e, ok := sink.expires("198.51.100.50"); !ok || time.Until(e) > 10*time.Minute+2*time.Second || time.Until(e) < 9*time.Minute {
		t.Errorf("the longer of two decisions on .50 deleted, then a resync: listed %v, ending in %v; want the 10m one's end", ok, time.Until(e))
	}
	if last := sink.deltas[len(sink.deltas)-1]; sink.writes() != writes+1 || sink.replaces != 1 || len(last.Remove) != 1 || len(last.Add) != 1 {
		t.Errorf("the resync wrote %d times (%d replaces), last delta %+v; want one delta removing and adding .50", sink.writes()-writes, sink.replaces, *last)
	}
	if err := b.Resync(ctx); err != nil || sink.writes() != writes+1 {
		t.Errorf("a resync with nothing changed: %v, %d writes: %+v", err, sink.writes()-writes-1, *sink.deltas[len(sink.deltas)-1])
	}

	// An expiry lifts the entry in the list by itself; CrowdSec's deletion of
	// the expired decision then needs no write.
	lapi.Cscli("decisions", "add", "--ip", "198.51.100.9", "-d", "2s")
	poll("a short decision")
	if !sink.has("198.51.100.9") {
		t.Fatal("a decision of 2s: not listed")
	}
	writes = sink.writes()
	deadline := time.Now().Add(5 * time.Second)
	for sink.has("198.51.100.9") {
		if time.Now().After(deadline) {
			t.Fatal("a decision of 2s still listed after 5s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	poll("after the expiry")
	if sink.writes() != writes {
		t.Errorf("the expired decision's deletion wrote %d times", sink.writes()-writes)
	}

	// A failed write: the next pull makes the whole list again.
	lapi.Cscli("decisions", "add", "--ip", "198.51.100.30", "-d", "1h")
	sink.fail = true
	if err := b.Poll(ctx); err == nil || !strings.Contains(err.Error(), "the store is down") {
		t.Fatalf("a failed write: Poll = %v", err)
	}
	poll("after a failed write")
	if sink.replaces != 2 || !sink.has("198.51.100.30") || !sink.has("198.51.100.8") || sink.has("198.51.100.7") {
		t.Errorf("after a failed write: %d replaces; 198.51.100.30 listed %v, .8 %v, .7 %v; want a second replace with .30 and .8, not .7",
			sink.replaces, sink.has("198.51.100.30"), sink.has("198.51.100.8"), sink.has("198.51.100.7"))
	}
	if st := b.Stats(); st.Errors != 1 || st.LastError != "" {
		t.Errorf("stats %+v: want one error, none now", st)
	}
}

// TestBouncerRunThroughOutage: Run pulls on its interval; while the Local API
// is down the pulls fail and are counted, and once it is back the whole list is
// made again (a replace), with what changed meanwhile.
func TestBouncerRunThroughOutage(t *testing.T) {
	lapi := crowdsectest.Start(t)
	lapi.Cscli("decisions", "add", "--ip", "198.51.100.1", "-d", "1h")
	lapi.Cscli("decisions", "add", "--ip", "198.51.100.2", "-d", "1h")
	sink := newListSink()
	b, err := crowdsec.New(crowdsec.Config{LAPIURL: lapi.URL, APIKeyFile: lapi.KeyFile, PollInterval: config.Duration(200 * time.Millisecond)}, sink, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20s; stats %+v\ncrowdsec's log:\n%s", what, b.Stats(), lapi.Log())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("the startup list", func() bool { return sink.has("198.51.100.1") && sink.has("198.51.100.2") })
	lapi.Stop()
	waitFor("a failed pull", func() bool { st := b.Stats(); return st.Errors > 0 && st.LastError != "" })
	lapi.Restart()
	lapi.Cscli("decisions", "delete", "--ip", "198.51.100.2")
	lapi.Cscli("decisions", "add", "--ip", "198.51.100.3", "-d", "1h")
	waitFor("the list after the outage", func() bool {
		return sink.has("198.51.100.1") && !sink.has("198.51.100.2") && sink.has("198.51.100.3")
	})
	sink.mu.Lock()
	replaces := sink.replaces
	sink.mu.Unlock()
	if replaces < 2 {
		t.Errorf("%d replaces: the list was not made again after the failed pulls", replaces)
	}
	if st := b.Stats(); st.LastError != "" {
		t.Errorf("after the outage: last error %q", st.LastError)
	}
}

// A bouncer whose key is not a bouncer's is answered 403, and an answer over
// max_answer_bytes is refused: each an *AnswerError.
func TestBouncerRefusedKey(t *testing.T) {
	lapi := crowdsectest.Start(t)
	bad := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(bad, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := crowdsec.New(crowdsec.Config{LAPIURL: lapi.URL, APIKeyFile: bad}, newListSink(), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Poll(context.Background())
	var ae *crowdsec.AnswerError
	if !errors.As(err, &ae) || ae.Status != 403 || !strings.Contains(err.Error(), "API key was refused") {
		t.Fatalf("Poll with a wrong key = %v; want an *AnswerError of status 403 saying the key was refused", err)
	}
	if strings.Contains(err.Error(), "0123456789abcdef") {
		t.Errorf("the error shows the key: %v", err)
	}

	// An answer over max_answer_bytes is refused, and nothing is written.
	for i := range 8 {
		lapi.Cscli("decisions", "add", "--ip", fmt.Sprintf("198.51.100.%d", 10+i), "-d", "1h")
	}
	sink := newListSink()
	b, err = crowdsec.New(crowdsec.Config{LAPIURL: lapi.URL, APIKeyFile: lapi.KeyFile, MaxAnswerBytes: 1024}, sink, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Poll(context.Background())
	if !errors.As(err, &ae) || ae.Status != 200 || !strings.Contains(err.Error(), "over 1024 bytes") || !strings.Contains(err.Error(), "startup=true") {
		t.Fatalf("Poll of an answer over 1024 bytes = %v; want an *AnswerError naming the bound and the URL", err)
	}
	if sink.writes() != 0 {
		t.Errorf("an answer over the bound wrote %d times", sink.writes())
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  crowdsec.Config
		says string
	}{
		{crowdsec.Config{APIKeyFile: "k"}, "lapi_url: required"},
		{crowdsec.Config{LAPIURL: "127.0.0.1:8080", APIKeyFile: "k"}, "lapi_url: \"127.0.0.1:8080\" is not an http or https URL"},
		{crowdsec.Config{LAPIURL: "http://127.0.0.1:8080"}, "api_key_file: required"},
		{crowdsec.Config{LAPIURL: "http://127.0.0.1:8080", APIKeyFile: "k", List: "bad/name"}, "list: blacklist name: name \"bad/name\""},
		{crowdsec.Config{LAPIURL: "http://127.0.0.1:8080", APIKeyFile: "k", PollInterval: 1}, "poll_interval: 1ns: at least 100ms"},
		{crowdsec.Config{LAPIURL: "http://127.0.0.1:8080", APIKeyFile: "k", Types: []string{"ban", " "}}, "types[1]: empty"},
	} {
		c.cfg.Defaults()
		err := c.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.says)
		}
	}
	ok := crowdsec.Config{LAPIURL: "http://127.0.0.1:8080", APIKeyFile: "k"}
	ok.Defaults()
	if err := ok.Validate(); err != nil || ok.List != "crowdsec" || ok.PollInterval.D() != 10*time.Second || len(ok.Types) != 1 || ok.Types[0] != "ban" {
		t.Errorf("defaults %+v: %v", ok, err)
	}
}
