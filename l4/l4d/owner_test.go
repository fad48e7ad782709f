package l4d

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/tiergate/tiergate/internal/daemon"
)

// send makes an admin request from any goroutine and returns its status, or an error
// saying what failed.
func (td *testDaemon) send(method, path, body string) (int, error) {
	req, err := http.NewRequest(method, td.url+path, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	if td.token != "" {
		req.Header.Set("Authorization", "Bearer "+td.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode, nil
}

// TestConcurrentChangesAndReloads: admin API changes, POST /reload and reloads as
// SIGHUP makes them, all at once, run one after the other on the owner goroutine:
// none is lost, and the configuration the API reports, the state file and the
// datapath end the same.
func TestConcurrentChangesAndReloads(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "l4d.yaml")
	state := filepath.Join(dir, "state.json")
	writeFile(t, path, testConfig+"state_file: "+state+"\n")
	td := startDaemon(t, path)

	const writers, each, reloads = 4, 6, 8
	var wg sync.WaitGroup
	errs := make(chan error, writers*each*3+2*reloads)
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				name := fmt.Sprintf("m%d-%d", g, i)
				if _, err := td.send("PUT", "/pools/l7/members/"+name, fmt.Sprintf(`{"address": "10.0.0.%d"}`, 20+g*10+i)); err != nil {
					errs <- err
					continue
				}
				if i%2 == 0 {
					if _, err := td.send("POST", "/pools/l7/members/"+name+"/drain", ""); err != nil {
						errs <- err
					}
				}
				rule := fmt.Sprintf(`{"vip": "203.0.113.10", "protocol": "tcp", "port": %d, "pool": "l7"}`, 1000+g*100+i)
				if _, err := td.send("PUT", fmt.Sprintf("/rules/r%d-%d", g, i), rule); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Go(func() {
		for range reloads {
			if _, err := td.send("POST", "/reload", ""); err != nil {
				errs <- err
			}
		}
	})
	wg.Go(func() {
		for range reloads {
			if err := td.Reload(); err != nil { // as on SIGHUP
				errs <- fmt.Errorf("reload: %w", err)
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Every change is in force: the file's two members and rule, and each writer's.
	f := td.config()
	if n := len(f.Pools["l7"].Members); n != 2+writers*each {
		t.Errorf("%d members in force, want %d: %+v", n, 2+writers*each, f.Pools["l7"].Members)
	}
	if n := len(f.Rules); n != 1+writers*each {
		t.Errorf("%d rules in force, want %d", n, 1+writers*each)
	}
	for _, m := range f.Pools["l7"].Members {
		var g, i int
		if _, err := fmt.Sscanf(m.Name, "m%d-%d", &g, &i); err == nil && m.Drained != (i%2 == 0) {
			t.Errorf("member %s: drained %v", m.Name, m.Drained)
		}
	}

	// The state file holds what is in force.
	saved, err := readState(state)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(saved, f) {
		t.Errorf("the state file differs from the configuration in force:\n%+v\n%+v", saved, f)
	}

	// And so does the datapath.
	type member struct {
		name    string
		drained bool
	}
	var want, got []member
	for _, m := range f.Pools["l7"].Members {
		want = append(want, member{m.Name, m.Drained})
	}
	s := td.status()
	for _, m := range s.Members {
		if m.Pool == "l7" && !m.Retired {
			got = append(got, member{m.Name, m.Drained})
		}
	}
	byName := func(ms []member) { sort.Slice(ms, func(a, b int) bool { return ms[a].name < ms[b].name }) }
	byName(want)
	byName(got)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the datapath's members differ from the configuration in force:\n%v\n%v", got, want)
	}
	if len(s.Rules) != len(f.Rules) {
		t.Errorf("the datapath has %d rules, the configuration %d", len(s.Rules), len(f.Rules))
	}
	td.want("GET", "/metrics", "", 200,
		fmt.Sprintf(`tiergate_l4_config_changes_total{result="ok",source="api"} %d`, writers*each*2+writers*(each/2)),
		fmt.Sprintf(`tiergate_l4_config_changes_total{result="ok",source="reload"} %d`, 2*reloads))
}

// TestChangeAfterStop: once l4d has stopped, a change is refused as unavailable and
// a reload with errStopped, instead of waiting or touching a closed datapath.
func TestChangeAfterStop(t *testing.T) {
	td := startWith(t, testConfig)
	if err := td.stop(); err != nil {
		t.Fatal(err)
	}
	if err := td.Reload(); err != errStopped {
		t.Errorf("reload after the stop: %v, want %v", err, errStopped)
	}
	_, err := td.change(func(f *Forwarding) (any, error) { return nil, nil }, nil)
	if e := daemon.AsAPIError(err); err == nil || e.Status != http.StatusServiceUnavailable || e.Code != codeUnavailable {
		t.Errorf("change after the stop: %v", err)
	}
}
