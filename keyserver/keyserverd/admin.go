package keyserverd

import (
	"errors"
	"net/http"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/keyserver"
)

// Error codes of the admin endpoint (the shape is daemon.APIError).
const (
	codeInvalidConfig   = "invalid_config"       // 400: the file does not validate, or a backend failed; nothing changed
	codeRestartRequired = "restart_required"     // 409: a setting fixed at start differs
	codeUnavailable     = daemon.CodeUnavailable // 503: keyserverd is stopping
)

// status is the body of GET /status and of a successful POST /reload.
type status struct {
	// Keys are the keys offered.
	Keys []keyInfo `json:"keys"`
	// Clients are the client rules in force.
	Clients []keyserver.ClientRule `json:"clients"`
	// AllowAllClients is set while allow_all_clients lets every certificate of the
	// client CA sign with every key.
	AllowAllClients bool `json:"allow_all_clients"`
	// Deny is the deny list in force.
	Deny keyserver.DenyList `json:"deny"`
	// Backends names the key backends, in order.
	Backends []string `json:"backends"`
	// Control is what keyserverd reports to the control plane, with a control
	// section.
	Control *agent.Status `json:"control,omitempty"`
}

// keyInfo is a key offered, in the admin endpoint's answers.
type keyInfo struct {
	ID    string `json:"id"`    // the key ID: SHA-256 of the SubjectPublicKeyInfo, hex
	Type  string `json:"type"`  // rsa, ecdsa or ed25519
	Label string `json:"label"` // the key's label in its backend
}

// adminHandler serves the admin endpoint:
//
//	GET  /healthz   ok while serving with keys (with a control section, with none too:
//	                its keys come from the control plane's uploads); 503 with the
//	                reason otherwise, and while stopping
//	GET  /metrics   Prometheus metrics
//	GET  /status    the keys offered, the client rules and the backends
//	POST /reload    re-read the configuration file (as SIGHUP); 200 with the new status
//
// With an admin token, every request but GET /healthz and GET /metrics must carry it.
func (d *Daemon) adminHandler() http.Handler {
	healthy := d.srv.Healthy
	if d.file.Control != nil {
		healthy = func() error {
			if err := d.srv.Healthy(); !errors.Is(err, keyserver.ErrNoKeys) {
				return err
			}
			return nil
		}
	}
	mux := daemon.AdminMux(d.Reg, d.Lame.Healthy(healthy))
	mux.Handle("GET /status", daemon.Handler(func(w http.ResponseWriter, r *http.Request) error {
		var st status
		if err := d.do(func() { st = d.status() }); err != nil {
			return daemon.Wrap(http.StatusServiceUnavailable, codeUnavailable, "", err)
		}
		daemon.WriteJSON(w, http.StatusOK, st)
		return nil
	}))
	mux.Handle("POST /reload", daemon.Handler(func(w http.ResponseWriter, r *http.Request) error {
		if d.Lame.Stopping() {
			return daemon.Wrap(http.StatusServiceUnavailable, codeUnavailable, "", errStopping)
		}
		var st status
		var err error
		if e := d.do(func() {
			if err = d.reload(); err == nil {
				st = d.status()
			}
		}); e != nil {
			return daemon.Wrap(http.StatusServiceUnavailable, codeUnavailable, "", e)
		}
		if err != nil {
			return reloadError(err)
		}
		d.Log.Info("reloaded through the admin endpoint", "from", r.RemoteAddr)
		daemon.WriteJSON(w, http.StatusOK, st)
		return nil
	}))
	return d.Auth.Wrap(mux)
}

// status describes what is served; on Run's goroutine.
func (d *Daemon) status() status {
	st := status{Keys: []keyInfo{}, Clients: d.file.Server.Clients, AllowAllClients: d.srv.AllowsAllClients(), Deny: d.file.Server.Deny}
	for _, k := range d.srv.Keys() {
		st.Keys = append(st.Keys, keyInfo{ID: k.ID.String(), Type: k.Type.String(), Label: k.Label})
	}
	if st.Clients == nil {
		st.Clients = []keyserver.ClientRule{}
	}
	for _, b := range d.srv.Backends() {
		st.Backends = append(st.Backends, b.Name())
	}
	if a := d.control.Load(); a != nil {
		cs := a.Status()
		st.Control = &cs
	}
	return st
}

// reloadError maps a failed reload to the API's error shape.
func reloadError(err error) *daemon.APIError {
	var re *daemon.RestartError
	if errors.As(err, &re) {
		return daemon.Wrap(http.StatusConflict, codeRestartRequired, "reload refused; the running configuration stays", err)
	}
	return daemon.Wrap(http.StatusBadRequest, codeInvalidConfig, "reload failed; the running configuration stays", err)
}
