package l4d

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"reflect"
	"slices"

	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/l4/datapath"
)

// maxBody bounds an admin request body.
const maxBody = 8 << 20

// apiError is the one error shape of the admin API.
type apiError struct {
	Status  int    `json:"status"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *apiError) Error() string { return e.Message }

// Error codes of the admin API.
const (
	codeBadRequest      = "bad_request"      // 400: the body is not the JSON expected
	codeInvalidConfig   = "invalid_config"   // 400: the change does not validate; nothing changed
	codeNotFound        = "not_found"        // 404: no such rule, pool or member
	codeRestartRequired = "restart_required" // 409: a section fixed at start differs
	codeStateFile       = "state_file"       // 500: the state file could not be written
	codeUnavailable     = "unavailable"      // 503: the datapath is stopping
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	var e *apiError
	if !errors.As(err, &e) {
		e = &apiError{Status: http.StatusInternalServerError, Code: "internal", Message: err.Error()}
	}
	writeJSON(w, e.Status, e)
}

func notFound(format string, args ...any) *apiError {
	return &apiError{Status: http.StatusNotFound, Code: codeNotFound, Message: fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Code: codeBadRequest, Message: fmt.Sprintf(format, args...)}
}

// decodeBody decodes the request's JSON body into v, refusing unknown fields.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := decodeJSON(http.MaxBytesReader(w, r.Body, maxBody), v); err != nil {
		writeError(w, badRequest("decoding the request body: %v", err))
		return false
	}
	return true
}

// configBody is the body of PUT /config: the forwarding configuration, optionally
// a log level, and optionally the sections fixed at start, which must then equal
// those in force.
type configBody struct {
	Forwarding
	LogLevel    *string    `json:"log_level"`
	AdminListen *string    `json:"admin_listen"`
	StateFile   *string    `json:"state_file"`
	DPDK        *DPDKFile  `json:"dpdk"`
	Ports       *PortsFile `json:"ports"`
	HashSeed    *uint64    `json:"hash_seed"`
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
//
// Every change builds a whole new configuration and applies it atomically; one the
// datapath rejects is answered 400 with the reason and changes nothing.
func (d *Daemon) adminHandler() http.Handler {
	mux := daemon.AdminMux(d.reg, d.healthy)
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, d.dist.Status())
	})
	mux.HandleFunc("GET /config", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, d.forwarding())
	})
	mux.HandleFunc("PUT /config", d.putConfig)
	mux.HandleFunc("POST /reload", func(w http.ResponseWriter, r *http.Request) {
		if err := d.Reload(); err != nil {
			writeError(w, reloadError(err))
			return
		}
		writeJSON(w, http.StatusOK, d.forwarding())
	})

	mux.HandleFunc("GET /rules", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, d.forwarding().Rules)
	})
	mux.HandleFunc("GET /rules/{name}", func(w http.ResponseWriter, r *http.Request) {
		f := d.forwarding()
		name := r.PathValue("name")
		i := ruleIndex(f.Rules, name)
		if i < 0 {
			writeError(w, notFound("no rule %q", name))
			return
		}
		writeJSON(w, http.StatusOK, f.Rules[i])
	})
	mux.HandleFunc("PUT /rules/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		var rule RuleFile
		if !decodeBody(w, r, &rule) {
			return
		}
		if rule.Name != "" && rule.Name != name {
			writeError(w, badRequest("the body names rule %q, the path %q", rule.Name, name))
			return
		}
		rule.Name = name
		created := false
		d.respond(w, r, func(f *Forwarding) (any, error) {
			if i := ruleIndex(f.Rules, name); i >= 0 {
				f.Rules[i] = rule
			} else {
				f.Rules = append(f.Rules, rule)
				created = true
			}
			return rule, nil
		}, &created)
	})
	mux.HandleFunc("DELETE /rules/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		d.respond(w, r, func(f *Forwarding) (any, error) {
			i := ruleIndex(f.Rules, name)
			if i < 0 {
				return nil, notFound("no rule %q", name)
			}
			f.Rules = slices.Delete(f.Rules, i, i+1)
			return nil, nil
		}, nil)
	})

	mux.HandleFunc("GET /pools", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, d.forwarding().Pools)
	})
	mux.HandleFunc("GET /pools/{pool}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("pool")
		p, ok := d.forwarding().Pools[name]
		if !ok {
			writeError(w, notFound("no pool %q", name))
			return
		}
		writeJSON(w, http.StatusOK, p)
	})
	mux.HandleFunc("PUT /pools/{pool}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("pool")
		var pool PoolFile
		if !decodeBody(w, r, &pool) {
			return
		}
		created := false
		d.respond(w, r, func(f *Forwarding) (any, error) {
			if f.Pools == nil {
				f.Pools = map[string]PoolFile{}
			}
			_, exists := f.Pools[name]
			created = !exists
			f.Pools[name] = pool
			return pool, nil
		}, &created)
	})
	mux.HandleFunc("DELETE /pools/{pool}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("pool")
		d.respond(w, r, func(f *Forwarding) (any, error) {
			if _, ok := f.Pools[name]; !ok {
				return nil, notFound("no pool %q", name)
			}
			delete(f.Pools, name)
			return nil, nil
		}, nil)
	})

	mux.HandleFunc("PUT /pools/{pool}/members/{member}", func(w http.ResponseWriter, r *http.Request) {
		pool, name := r.PathValue("pool"), r.PathValue("member")
		var m MemberFile
		if !decodeBody(w, r, &m) {
			return
		}
		if m.Name != "" && m.Name != name {
			writeError(w, badRequest("the body names member %q, the path %q", m.Name, name))
			return
		}
		m.Name = name
		created := false
		d.respond(w, r, func(f *Forwarding) (any, error) {
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
	mux.HandleFunc("DELETE /pools/{pool}/members/{member}", func(w http.ResponseWriter, r *http.Request) {
		pool, name := r.PathValue("pool"), r.PathValue("member")
		d.respond(w, r, func(f *Forwarding) (any, error) {
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
		mux.HandleFunc("POST /pools/{pool}/members/{member}/"+op.verb, func(w http.ResponseWriter, r *http.Request) {
			pool, name := r.PathValue("pool"), r.PathValue("member")
			d.respond(w, r, func(f *Forwarding) (any, error) {
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
	return d.auth.Wrap(mux)
}

// respond runs change and answers with its result.
func (d *Daemon) respond(w http.ResponseWriter, r *http.Request, fn func(*Forwarding) (any, error), created *bool) {
	res, err := d.change(fn)
	d.reply(w, r, res, err, created)
}

// reply answers a change with its result: 200 (201 when *created), 204 when the
// result is nil, or the error.
func (d *Daemon) reply(w http.ResponseWriter, r *http.Request, res any, err error, created *bool) {
	if err != nil {
		writeError(w, err)
		return
	}
	d.log.Info("configuration changed through the admin API", "request", r.Method+" "+r.URL.Path, "from", r.RemoteAddr)
	switch {
	case res == nil:
		w.WriteHeader(http.StatusNoContent)
	case created != nil && *created:
		writeJSON(w, http.StatusCreated, res)
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

func (d *Daemon) putConfig(w http.ResponseWriter, r *http.Request) {
	var body configBody
	if !decodeBody(w, r, &body) {
		return
	}
	var level *slog.Level
	if body.LogLevel != nil {
		lvl, err := daemon.LogLevel(*body.LogLevel)
		if err != nil {
			writeError(w, &apiError{Status: http.StatusBadRequest, Code: codeInvalidConfig, Message: err.Error()})
			return
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
		if c := body.Conntrack.Capacity; c != 0 && c != cur.Conntrack.Capacity {
			diff = append(diff, "conntrack.capacity")
		}
		if len(diff) > 0 {
			return nil, &apiError{Status: http.StatusConflict, Code: codeRestartRequired,
				Message: (&restartError{sections: diff}).Error() + " (edit the configuration file; PUT /config changes tunnel, conntrack.timeouts, rules and pools)"}
		}
		*f = body.Forwarding
		f.Conntrack.Capacity = cur.Conntrack.Capacity
		return *f, nil
	})
	if err == nil && level != nil {
		// Until the next reload, which sets the file's.
		d.level.Set(*level)
	}
	d.reply(w, r, res, err, nil)
}

// reloadError maps a failed reload to the API's error shape.
func reloadError(err error) *apiError {
	var re *restartError
	if errors.As(err, &re) {
		return &apiError{Status: http.StatusConflict, Code: codeRestartRequired, Message: "reload refused; the running configuration stays: " + err.Error()}
	}
	return &apiError{Status: http.StatusBadRequest, Code: codeInvalidConfig, Message: "reload failed; the running configuration stays: " + err.Error()}
}

// forwarding returns a copy of the forwarding configuration in force.
func (d *Daemon) forwarding() Forwarding {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fwd.clone()
}

// change applies fn to a copy of the forwarding configuration in force, then
// validates the result, writes it to the state file (when configured) and applies
// it to the datapath, all or nothing. It returns fn's result.
func (d *Daemon) change(fn func(*Forwarding) (any, error)) (res any, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer func() {
		var e *apiError
		if !errors.As(err, &e) || e.Status != http.StatusNotFound {
			d.count("api", err)
		}
	}()
	next := d.fwd.clone()
	res, err = fn(&next)
	if err != nil {
		return nil, err
	}
	dcfg, err := d.file.with(next).Datapath()
	if err != nil {
		return nil, &apiError{Status: http.StatusBadRequest, Code: codeInvalidConfig, Message: err.Error()}
	}
	var sw *stateWrite
	if d.file.StateFile != "" {
		if sw, err = prepareState(d.file.StateFile, next); err != nil {
			return nil, &apiError{Status: http.StatusInternalServerError, Code: codeStateFile, Message: "nothing changed: " + err.Error()}
		}
	}
	if err := d.dist.Apply(dcfg); err != nil {
		if sw != nil {
			sw.abort()
		}
		if errors.Is(err, datapath.ErrClosed) {
			return nil, &apiError{Status: http.StatusServiceUnavailable, Code: codeUnavailable, Message: err.Error()}
		}
		return nil, &apiError{Status: http.StatusBadRequest, Code: codeInvalidConfig, Message: err.Error()}
	}
	d.fwd = next
	if sw != nil {
		if err := sw.commit(); err != nil {
			d.log.Error("the change is in force but not saved", "err", err)
			return nil, &apiError{Status: http.StatusInternalServerError, Code: codeStateFile,
				Message: "the change is in force but was not saved (it will be lost at restart): " + err.Error()}
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

func ruleIndex(rules []RuleFile, name string) int {
	return slices.IndexFunc(rules, func(r RuleFile) bool { return r.Name == name })
}

func memberIndex(members []MemberFile, name string) int {
	return slices.IndexFunc(members, func(m MemberFile) bool { return m.Name == name })
}

// findMember returns the pool holding member name and its index, or a 404.
func findMember(f *Forwarding, pool, name string) (PoolFile, int, error) {
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
