package l7d

// Blacklists from the control plane.
//
// With a control section, l7d also follows the blacklists of the store
// (control/blsync): a list named "global" there is l7d's global list, and a list
// named as one of the listeners of the configuration is that listener's list, as
// with blacklists in the file; other lists of the store are not fetched. The
// versions in force are reported in the node's status (agent.Status.Blacklists),
// and the last version of each is kept in <state_dir>/blacklists, which a start
// with the store out of reach puts in force before the listeners serve. A list fed
// by the store is the store's: the admin endpoint refuses to change it (409
// list_from_control), and it should not also be given files under blacklists.

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// codeListFromControl is the admin API's error for a change of a list the control
// plane feeds (409).
const codeListFromControl = "list_from_control"

// BlacklistDirName is the folder of the state directory where the lists from the
// control plane are kept.
const BlacklistDirName = "blacklists"

// diskListsWait bounds how long the first start waits for the lists kept on disk
// to be put in force before it serves.
var diskListsWait = 10 * time.Second

// storeLists feeds d's lists from the store.
type storeLists struct {
	d     *Daemon
	f     *blsync.Follower
	dir   string
	names atomic.Pointer[[]string] // the listeners' names, once the first snapshot starts the server
	once  sync.Once
	ready chan struct{} // closed with names set: the follower may run

	warned sync.Map // list names warned about by warnFiles
}

// newStoreLists returns the follower of the store's blacklists for a node of nc,
// keeping them in stateDir.
func (d *Daemon) newStoreLists(nc *agent.NodeConfig, stateDir string) (*storeLists, error) {
	sl := &storeLists{d: d, dir: filepath.Join(stateDir, BlacklistDirName), ready: make(chan struct{})}
	f, err := blsync.NewFollower(blsync.FollowerConfig{
		Open: nc.OpenWith(d.Log.With("component", "store", "for", "blacklists")),
		Dir:  sl.dir,
		List: sl.list,
		Changed: func() {
			sl.warnFiles()
			if d.agent != nil {
				d.agent.Report()
			}
		},
		Logger: d.Log,
	})
	if err != nil {
		return nil, err
	}
	sl.f = f
	return sl, nil
}

// list is the Follower's List: the global list, a listener's, or nil.
func (sl *storeLists) list(name string) *blacklist.List {
	if name == blacklist.GlobalName {
		return sl.d.lists.Global()
	}
	if names := sl.names.Load(); names != nil && slices.Contains(*names, name) {
		return sl.d.lists.Listener(name)
	}
	return nil
}

// warnFiles warns, once per list, of a list the store feeds that the file also
// gives files: whichever changes last is in force.
func (sl *storeLists) warnFiles() {
	cfg := sl.d.current()
	if cfg == nil {
		return
	}
	for name := range sl.f.Versions() {
		if files := cfg.Blacklists[name].Files; len(files) > 0 {
			if _, done := sl.warned.LoadOrStore(name, true); !done {
				sl.d.Log.Warn("a blacklist fed by the control plane also has files in the configuration file: whichever changed last is in force",
					"list", name, "files", files)
			}
		}
	}
}

// versions is agent.Config.Blacklists.
func (sl *storeLists) versions() map[string]int64 { return sl.f.Versions() }

// fed reports whether the store feeds the list name.
func (sl *storeLists) fed(name string) bool {
	if sl == nil {
		return false
	}
	_, ok := sl.f.Versions()[name]
	return ok
}

// run runs the follower, once the listeners are known, until ctx is done.
func (sl *storeLists) run(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-sl.ready:
	}
	if err := sl.f.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		sl.d.Log.Error("blacklists from the control plane no longer followed", "err", err)
	}
}

// start lets the follower run with the lists of listeners, and waits, up to
// diskListsWait, for the lists kept on disk to be in force.
func (sl *storeLists) start(listeners []string) {
	names := slices.Clone(listeners)
	sl.names.Store(&names)
	first := false
	sl.once.Do(func() { first = true; close(sl.ready) })
	if !first {
		return
	}
	var want []string
	files, _ := filepath.Glob(filepath.Join(sl.dir, "*.json"))
	for _, p := range files {
		name := strings.TrimSuffix(filepath.Base(p), ".json")
		if _, err := os.Stat(strings.TrimSuffix(p, ".json") + ".bl"); err == nil && sl.list(name) != nil {
			want = append(want, name)
		}
	}
	deadline := time.Now().Add(diskListsWait)
	for _, name := range want {
		for !sl.fed(name) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if !sl.fed(name) {
			sl.d.Log.Warn("serving before the blacklist kept on disk is in force", "list", name, "dir", sl.dir)
		}
	}
}

// fromControl refuses a change of a list the store feeds.
func (d *Daemon) fromControl(l *blacklist.List) error {
	if !d.blsync.fed(l.Name()) {
		return nil
	}
	return daemon.Errorf(http.StatusConflict, codeListFromControl,
		"list %q is fed by the control plane (version %d in force): change it there (tgctl blacklist)", l.Name(), d.blsync.f.Versions()[l.Name()])
}
