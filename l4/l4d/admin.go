package l4d

import (
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"reflect"
	"slices"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/l4/datapath"
)

// maxBody bounds an admin request body.
const maxBody = 8 << 20

// Error codes of the admin API (the shape is daemon.APIError).
const (
	codeBadRequest      = daemon.CodeBadRequest  // 400: the body is not the JSON expected
	codeInvalidConfig   = "invalid_config"       // 400: the change does not validate; nothing changed
	codeNotFound        = daemon.CodeNotFound    // 404: no such rule, pool or member
	codeRestartRequired = "restart_required"     // 409: a section fixed at start differs
	codeStateFile       = "state_file"           // 500: the state file could not be written
	codeUnavailable     = daemon.CodeUnavailable // 503: the datapath is stopping
)

func notFound(format string, args ...any) *daemon.APIError {
	return daemon.Errorf(http.StatusNotFound, codeNotFound, format, args...)
}

func badRequest(format string, args ...any) *daemon.APIError {
	return daemon.Errorf(http.StatusBadRequest, codeBadRequest, format, args...)
}

func invalidConfig(err error) *daemon.APIError {
	return daemon.Wrap(http.StatusBadRequest, codeInvalidConfig, "", err)
}

// decodeBody decodes the request's JSON body into v, refusing unknown fields. A
// value that does not parse (an address, a duration) is invalid_config, like any
// other value the configuration refuses; a body that is not the JSON expected is
// bad_request.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	err := daemon.DecodeRequest(w, r, maxBody, v)
	var fe *config.FieldError
	if errors.As(err, &fe) {
		return invalidConfig(fe)
	}
	return err
}

// configBody is the body of PUT /config: the forwarding configuration, optionally
// a log level, and optionally the sections fixed at start, which must then equal
// those in force.
type configBody struct {
	Forwarding
	LogLevel    *string    `json:"log_level"`
	AdminListen *string    `json:"admin_listen"`
	StateFile   *string    `json:"state_file"`
	StateDir    *string    `json:"state_dir"`
	Insecure    *bool      `json:"admin_insecure"`
	DPDK        *DPDKFile  `json:"dpdk"`
	Ports       *PortsFile `json:"ports"`
	HashSeed    *uint64    `json:"hash_seed"`
	// The admin token and hosts change with the file (reload) only; PUT /config
	// reads and leaves them.
	AdminHosts []string `json:"admin_hosts"`
	TokenFile  *string  `json:"admin_token_file"`
}

// adminHandler serves /metrics, /healthz and the admin API:
//
//	GET    /status                              datapath status (rules, members, counters, neighbours)
//	GET    /config                              the forwarding configuration in force
//	PUT    /config                              replace it whole
//	GET    /rules, /rules/{name}                rules
//	PUT    /rules/{name}                        add or replace a rule
//	DELETE /rules/{name}                        remove a rule
//	GET    /pools, /pools/{pool}                pools
//	PUT    /pools/{pool}                        add or replace a pool (members and health)
//	DELETE /pools/{pool}                        remove a pool no rule uses
//	PUT    /pools/{pool}/members/{member}       add or replace a member
//	DELETE /pools/{pool}/members/{member}       remove a member
//	POST   /pools/{pool}/members/{member}/drain   no new flows to the member
//	POST   /pools/{pool}/members/{member}/undrain
//	POST   /reload                              re-read the configuration file (as SIGHUP)
//	GET    /control                             the control plane's agent: node, revision in force or refused
//	GET    /bgp                                 BGP sessions, VIPs announced or withdrawn and why (bgp section)
//	POST   /drain                               withdraw every VIP from the routers (operator drain of the LD)
//	POST   /undrain                             announce them again
//	GET    /trace                               recent trace and drop points of marked probes (trace section); ?src=, ?kind=, ?reason=, ?limit=
//
// Every change builds a whole new configuration and applies it atomically; one the
// datapath rejects is answered 400 with the reason and changes nothing. With a
// control section the rules and pools come from the control plane, and the changes
// above (PUT /config included) are refused 409 control_plane.
func (d *Daemon) adminHandler() http.Handler {
	mux := daemon.AdminMux(d.Reg, d.healthy)
	handle := func(pattern string, h daemon.Handler) { mux.Handle(pattern, h) }
	handle("GET /status", func(w http.ResponseWriter, r *http.Request) error {
		daemon.WriteJSON(w, http.StatusOK, d.dist.Status())
		return nil
	})
	handle("GET /config", func(w http.ResponseWriter, r *http.Request) error {
		daemon.WriteJSON(w, http.StatusOK, d.forwarding())
		return nil
	})
	handle("PUT /config", d.putConfig)
	handle("GET /control", func(w http.ResponseWriter, r *http.Request) error {
		daemon.WriteJSON(w, http.StatusOK, d.controlInfo())
		return nil
	})
	handle("POST /reload", func(w http.ResponseWriter, r *http.Request) error {
		if err := d.Reload(); err != nil {
			return reloadError(err)
		}
		daemon.WriteJSON(w, http.StatusOK, d.forwarding())
		return nil
	})

	handle("GET /rules", func(w http.ResponseWriter, r *http.Request) error {
		daemon.WriteJSON(w, http.StatusOK, d.forwarding().Rules)
		return nil
	})
	handle("GET /rules/{name}", func(w http.ResponseWriter, r *http.Request) error {
		f := d.forwarding()
		name := r.PathValue("name")
		i := ruleIndex(f.Rules, name)
		if i < 0 {
			return notFound("no rule %q", name)
		}
		daemon.WriteJSON(w, http.StatusOK, f.Rules[i])
		return nil
	})
	handle("PUT /rules/{name}", func(w http.ResponseWriter, r *http.Request) error {
		name := r.PathValue("name")
		var rule datapath.RuleConfig
		if err := decodeBody(w, r, &rule); err != nil {
			return err
		}
		if rule.Name != "" && rule.Name != name {
			return badRequest("the body names rule %q, the path %q", rule.Name, name)
		}
		rule.Name = name
		created := false
		return d.respond(w, r, func(f *Forwarding) (any, error) {
			if i := ruleIndex(f.Rules, name); i >= 0 {
				f.Rules[i] = rule
			} else {
				f.Rules = append(f.Rules, rule)
				created = true
			}
			return rule, nil
		}, &created)
	})
	handle("DELETE /rules/{name}", func(w http.ResponseWriter, r *http.Request) error {
		name := r.PathValue("name")
		return d.respond(w, r, func(f *Forwarding) (any, error) {
			i := ruleIndex(f.Rules, name)
			if i < 0 {
				return nil, notFound("no rule %q", name)
			}
			f.Rules = slices.Delete(f.Rules, i, i+1)
			return nil, nil
		}, nil)
	})

	handle("GET /pools", func(w http.ResponseWriter, r *http.Request) error {
		daemon.WriteJSON(w, http.StatusOK, d.forwarding().Pools)
		return nil
	})
	handle("GET /pools/{pool}", func(w http.ResponseWriter, r *http.Request) error {
		name := r.PathValue("pool")
		p, ok := d.forwarding().Pools[name]
		if !ok {
			return notFound("no pool %q", name)
		}
		daemon.WriteJSON(w, http.StatusOK, p)
		return nil
	})
	handle("PUT /pools/{pool}", func(w http.ResponseWriter, r *http.Request) error {
		name := r.PathValue("pool")
		var pool datapath.PoolConfig
		if err := decodeBody(w, r, &pool); err != nil {
			return err
		}
		created := false
		return d.respond(w, r, func(f *Forwarding) (any, error) {
			if f.Pools == nil {
				f.Pools = map[string]datapath.PoolConfig{}
			}
			_, exists := f.Pools[name]
			created = !exists
			f.Pools[name] = pool
			return pool, nil
		}, &created)
	})
	handle("DELETE /pools/{pool}", func(w http.ResponseWriter, r *http.Request) error {
		name := r.PathValue("pool")
		return d.respond(w, r, func(f *Forwarding) (any, error) {
			if _, ok := f.Pools[name]; !ok {
				return nil, notFound("no pool %q", name)
			}
			delete(f.Pools, name)
			return nil, nil
		}, nil)
	})

	handle("PUT /pools/{pool}/members/{member}", func(w http.ResponseWriter, r *http.Request) error {
		pool, name := r.PathValue("pool"), r.PathValue("member")
		var m datapath.MemberConfig
		if err := decodeBody(w, r, &m); err != nil {
			return err
		}
		if m.Name != "" && m.Name != name {
			return badRequest("the body names member %q, the path %q", m.Name, name)
		}
		m.Name = name
		created := false
		return d.respond(w, r, func(f *Forwarding) (any, error) {
			p, ok := f.Pools[pool]
			if !ok {
				return nil, notFound("no pool %q", pool)
			}
			if i := memberIndex(p.Members, name); i >= 0 {
				p.Members[i] = m
			} else {
				p.Members = append(p.Members, m)
				created = true
			}
			f.Pools[pool] = p
			return m, nil
		}, &created)
	})
	handle("DELETE /pools/{pool}/members/{member}", func(w http.ResponseWriter, r *http.Request) error {
		pool, name := r.PathValue("pool"), r.PathValue("member")
		return d.respond(w, r, func(f *Forwarding) (any, error) {
			p, i, err := findMember(f, pool, name)
			if err != nil {
				return nil, err
			}
			p.Members = slices.Delete(p.Members, i, i+1)
			f.Pools[pool] = p
			return nil, nil
		}, nil)
	})
	for _, op := range []struct {
		verb    string
		drained bool
	}{{"drain", true}, {"undrain", false}} {
		handle("POST /pools/{pool}/members/{member}/"+op.verb, func(w http.ResponseWriter, r *http.Request) error {
			pool, name := r.PathValue("pool"), r.PathValue("member")
			return d.respond(w, r, func(f *Forwarding) (any, error) {
				p, i, err := findMember(f, pool, name)
				if err != nil {
					return nil, err
				}
				p.Members[i].Drained = op.drained
				f.Pools[pool] = p
				return p.Members[i], nil
			}, nil)
		})
	}
	d.bgpRoutes(handle)
	d.traceRoutes(handle)
	return d.Auth.Wrap(mux)
}

// respond runs change and answers with its result.
func (d *Daemon) respond(w http.ResponseWriter, r *http.Request, fn func(*Forwarding) (any, error), created *bool) error {
	res, err := d.change(fn, nil)
	return d.reply(w, r, res, err, created)
}

// reply answers a change with its result: 200 (201 when *created), 204 when the
// result is nil, or returns the error.
func (d *Daemon) reply(w http.ResponseWriter, r *http.Request, res any, err error, created *bool) error {
	if err != nil {
		return err
	}
	d.Log.Info("configuration changed through the admin API", "request", r.Method+" "+r.URL.Path, "from", r.RemoteAddr)
	switch {
	case res == nil:
		w.WriteHeader(http.StatusNoContent)
	case created != nil && *created:
		daemon.WriteJSON(w, http.StatusCreated, res)
	default:
		daemon.WriteJSON(w, http.StatusOK, res)
	}
	return nil
}

func (d *Daemon) putConfig(w http.ResponseWriter, r *http.Request) error {
	var body configBody
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	var level *slog.Level
	if body.LogLevel != nil {
		lvl, err := daemon.LogLevel(*body.LogLevel)
		if err != nil {
			return invalidConfig(err)
		}
		level = &lvl
	}
	res, err := d.change(func(f *Forwarding) (any, error) {
		var diff []string
		cur := d.file
		if body.DPDK != nil {
			p := *body.DPDK
			p.fill()
			if !reflect.DeepEqual(p, cur.DPDK) {
				diff = append(diff, "dpdk")
			}
		}
		if body.Ports != nil && !reflect.DeepEqual(*body.Ports, cur.Ports) {
			diff = append(diff, "ports")
		}
		if body.HashSeed != nil && *body.HashSeed != cur.HashSeed {
			diff = append(diff, "hash_seed")
		}
		if body.AdminListen != nil && *body.AdminListen != cur.AdminListen {
			diff = append(diff, "admin_listen")
		}
		if body.StateFile != nil && *body.StateFile != cur.StateFile {
			diff = append(diff, "state_file")
		}
		if body.StateDir != nil && *body.StateDir != cur.StateDir {
			diff = append(diff, "state_dir")
		}
		if body.Insecure != nil && *body.Insecure != cur.AdminInsecure {
			diff = append(diff, "admin_insecure")
		}
		if c := body.Conntrack.Capacity; c != 0 && c != cur.Conntrack.Capacity {
			diff = append(diff, "conntrack.capacity")
		}
		if len(diff) > 0 {
			return nil, daemon.Errorf(http.StatusConflict, codeRestartRequired, "%s (edit the configuration file; PUT /config changes tunnel, conntrack.timeouts, rules and pools)",
				(&daemon.RestartError{Daemon: "l4d", Fields: diff}).Error())
		}
		*f = body.Forwarding
		f.Conntrack.Capacity = cur.Conntrack.Capacity
		return *f, nil
	}, func() {
		if level != nil {
			// Until the next reload, which sets the file's.
			d.Level.Set(*level)
		}
	})
	return d.reply(w, r, res, err, nil)
}

// reloadError maps a failed reload to the API's error shape.
func reloadError(err error) *daemon.APIError {
	if errors.Is(err, errStopped) || errors.Is(err, daemon.ErrNotStarted) {
		return daemon.Wrap(http.StatusServiceUnavailable, codeUnavailable, "", err)
	}
	var re *daemon.RestartError
	if errors.As(err, &re) {
		return daemon.Wrap(http.StatusConflict, codeRestartRequired, "reload refused; the running configuration stays", err)
	}
	return daemon.Wrap(http.StatusBadRequest, codeInvalidConfig, "reload failed; the running configuration stays", err)
}

// forwarding returns the forwarding configuration in force, a snapshot its callers
// read and must not modify.
func (d *Daemon) forwarding() Forwarding { return d.current().fwd }

// change runs on the owner goroutine, after the changes queued before it: it applies
// fn to a copy of the forwarding configuration in force, then validates the result,
// writes it to the state file (when configured) and applies it to the datapath, all
// or nothing, and then calls committed (when not nil). It returns fn's result; fn and
// committed run on the owner goroutine.
func (d *Daemon) change(fn func(*Forwarding) (any, error), committed func()) (res any, err error) {
	if err := d.controlled(); err != nil {
		return nil, err
	}
	if e := d.do(func() {
		res, err = d.applyChange(fn)
		if err == nil && committed != nil {
			committed()
		}
	}); e != nil {
		return nil, daemon.Wrap(http.StatusServiceUnavailable, codeUnavailable, "", e)
	}
	return res, err
}

// applyChange is change on the owner goroutine, without committed.
func (d *Daemon) applyChange(fn func(*Forwarding) (any, error)) (res any, err error) {
	defer func() {
		var e *daemon.APIError
		if !errors.As(err, &e) || e.Status != http.StatusNotFound {
			d.CountChange("api", err)
		}
	}()
	next := d.fwd.clone()
	res, err = fn(&next)
	if err != nil {
		return nil, err
	}
	dcfg, err := d.file.with(next).Datapath()
	if err != nil {
		return nil, invalidConfig(err)
	}
	var sw *daemon.PendingFile
	if d.file.StateFile != "" {
		if sw, err = prepareState(d.file.StateFile, next); err != nil {
			return nil, daemon.Wrap(http.StatusInternalServerError, codeStateFile, "nothing changed", err)
		}
	}
	if err := d.dist.Apply(dcfg); err != nil {
		if sw != nil {
			sw.Abort()
		}
		if errors.Is(err, datapath.ErrClosed) {
			return nil, daemon.Wrap(http.StatusServiceUnavailable, codeUnavailable, "", err)
		}
		return nil, invalidConfig(err)
	}
	d.setInForce(d.file, next)
	if sw != nil {
		if err := sw.Commit(); err != nil {
			msg := "the change is in force but was not saved (it will be lost at restart)"
			if errors.Is(err, daemon.ErrNotDurable) {
				msg = "the change is in force and saved, but the save may not survive a power loss"
			}
			d.Log.Error(msg, "err", err)
			return nil, daemon.Wrap(http.StatusInternalServerError, codeStateFile, msg, err)
		}
	}
	return res, nil
}

// clone returns a deep copy of f.
func (f Forwarding) clone() Forwarding {
	f.Rules = slices.Clone(f.Rules)
	pools := maps.Clone(f.Pools)
	for name, p := range pools {
		p.Members = slices.Clone(p.Members)
		pools[name] = p
	}
	f.Pools = pools
	return f
}

func ruleIndex(rules []datapath.RuleConfig, name string) int {
	return slices.IndexFunc(rules, func(r datapath.RuleConfig) bool { return r.Name == name })
}

func memberIndex(members []datapath.MemberConfig, name string) int {
	return slices.IndexFunc(members, func(m datapath.MemberConfig) bool { return m.Name == name })
}

// findMember returns the pool holding member name and its index, or a 404.
func findMember(f *Forwarding, pool, name string) (datapath.PoolConfig, int, error) {
	p, ok := f.Pools[pool]
	if !ok {
		return p, -1, notFound("no pool %q", pool)
	}
	i := memberIndex(p.Members, name)
	if i < 0 {
		return p, -1, notFound("no member %q in pool %q", name, pool)
	}
	return p, i, nil
}
