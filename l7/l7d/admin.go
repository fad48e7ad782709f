package l7d

import (
	"errors"
	"io"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/l7"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// Error codes of l7d's admin API, besides daemon's.
const (
	codeReloadFailed     = "reload_failed"      // 422: the file is not a configuration l7d can apply
	codeRestartRequired  = "restart_required"   // 422: the file changes what only a restart applies
	codeUnknownList      = "unknown_list"       // 404: no such blacklist
	codeInvalidList      = "invalid_list"       // 422: an upload that is not a list or delta
	codeBadLines         = "bad_lines"          // 422: an upload with bad lines, listed
	codeStateWriteFailed = "state_write_failed" // 500: the list's state file could not be written
	codeListFilesFailed  = "list_files_failed"  // 500: the list's files could not be loaded
	codeBusy             = "busy"               // 429: another upload is being read
)

// badLines are the details of a bad_lines error: how many lines were bad, and the
// first of them.
type badLines struct {
	BadLines int       `json:"bad_lines"`
	Lines    []badLine `json:"lines"`
}

type badLine struct {
	Line  int    `json:"line"`
	Text  string `json:"text"`
	Error string `json:"error"`
}

// listInfo describes a blacklist in the admin API's answers.
type listInfo struct {
	List       string   `json:"list"`
	Entries    int      `json:"entries"`
	Bytes      int      `json:"bytes"`
	Action     string   `json:"action"`
	Files      []string `json:"files,omitempty"`
	StateFile  string   `json:"state_file,omitempty"` // where the pushed list in force is kept
	HitsPacket uint64   `json:"hits_packet"`
	HitsHeader uint64   `json:"hits_header"`
}

func (d *Daemon) listInfo(l *blacklist.List) listInfo {
	cfg := d.current()
	b := cfg.Blacklists[l.Name()]
	action := b.Action
	if action == "" {
		action = blacklist.ActionForbid
	}
	s := l.Snapshot()
	return listInfo{List: l.Name(), Entries: s.Len(), Bytes: s.Bytes(), Action: action, Files: b.Files,
		StateFile:  d.bl.Source(l.Name()).StateFile,
		HitsPacket: l.Hits(blacklist.SourcePacket), HitsHeader: l.Hits(blacklist.SourceHeader)}
}

// adminHandler serves /metrics, /healthz, POST /reload and the blacklist API:
//
//	GET    /blacklists                 every list in use: entries, action, hits
//	GET    /blacklists/{name}          one list
//	PUT    /blacklists/{name}          replace a list whole (text, binary or gzip)
//	POST   /blacklists/{name}/delta    add and remove entries (text delta, or gzip)
//	DELETE /blacklists/{name}/state    drop what was pushed: back to the list's files
//
// name is "global" or a listener's name. An upload is parsed whole before anything
// changes: a bad one is answered 422 with the bad lines by number, and the list in
// force stays; a good one is written to the list's state file when there is a
// state_dir (a failure answers 500, code state_write_failed, and the list in force
// stays), then swapped in atomically and answered 200 with the list's new size. A
// reload that fails is answered 422, code reload_failed (or restart_required). Every
// error has daemon.APIError's JSON shape. Changes run on the owner goroutine, one after
// the other. With an admin token, every request but GET /healthz and GET /metrics must
// carry it (daemon.AdminAuth).
//
// Uploads are read one at a time, as a stream, within admin_blacklist_uploads: one
// over a limit is answered 413, code too_large, naming the limit (details "limit" and
// "max"); one that waited longer than the limits' wait for another, 429, code busy,
// with Retry-After.
func (d *Daemon) adminHandler() http.Handler {
	mux := daemon.AdminMux(d.Reg, d.Lame.Healthy(d.srv.Healthy))
	uploads := d.uploader()
	handle := func(pattern string, h daemon.Handler) { mux.Handle(pattern, h) }
	handle("/reload", func(w http.ResponseWriter, r *http.Request) error {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			return daemon.Errorf(http.StatusMethodNotAllowed, daemon.CodeBadRequest, "use POST")
		}
		if err := d.Reload(); err != nil {
			return reloadError(err)
		}
		io.WriteString(w, "reloaded\n")
		return nil
	})
	handle("GET /blacklists", func(w http.ResponseWriter, r *http.Request) error {
		names := append([]string{blacklist.GlobalName}, d.lists.Names()...)
		out := make([]listInfo, 0, len(names))
		for _, n := range names {
			out = append(out, d.listInfo(d.lists.Listener(n)))
		}
		daemon.WriteJSON(w, http.StatusOK, out)
		return nil
	})
	handle("GET /blacklists/{name}", func(w http.ResponseWriter, r *http.Request) error {
		l, err := d.list(r)
		if err != nil {
			return err
		}
		daemon.WriteJSON(w, http.StatusOK, d.listInfo(l))
		return nil
	})
	handle("PUT /blacklists/{name}", func(w http.ResponseWriter, r *http.Request) error {
		l, err := d.list(r)
		if err != nil {
			return err
		}
		if err := d.fromControl(l); err != nil {
			return err
		}
		lim := d.current().AdminBlacklistUploads
		release, err := uploads.Acquire(r.Context(), lim)
		if err != nil {
			return busyError(w, err)
		}
		defer release()
		s, err := uploads.Read(r.Body, lim)
		if err != nil {
			return uploadError(err)
		}
		var info listInfo
		if e := d.do(func(*control) { err = d.bl.Replace(l, s); info = d.listInfo(l) }); e != nil {
			return stoppingError(e)
		}
		if err != nil {
			return d.stateError(l, err)
		}
		d.Log.Info("blacklist replaced through the admin API", "list", l.Name(), "entries", info.Entries, "from", r.RemoteAddr)
		daemon.WriteJSON(w, http.StatusOK, info)
		return nil
	})
	handle("POST /blacklists/{name}/delta", func(w http.ResponseWriter, r *http.Request) error {
		l, err := d.list(r)
		if err != nil {
			return err
		}
		if err := d.fromControl(l); err != nil {
			return err
		}
		lim := d.current().AdminBlacklistUploads
		release, err := uploads.Acquire(r.Context(), lim)
		if err != nil {
			return busyError(w, err)
		}
		defer release()
		delta, err := uploads.ReadDelta(r.Body, lim)
		if err != nil {
			return uploadError(err)
		}
		var info listInfo
		if e := d.do(func(*control) { err = d.bl.Apply(l, delta); info = d.listInfo(l) }); e != nil {
			return stoppingError(e)
		}
		var sw *blacklist.StateWriteError
		switch {
		case errors.As(err, &sw):
			return d.stateError(l, err)
		case err != nil:
			return uploadError(err)
		}
		d.Log.Info("blacklist changed through the admin API", "list", l.Name(), "added", len(delta.Add),
			"removed", len(delta.Remove), "entries", info.Entries, "from", r.RemoteAddr)
		daemon.WriteJSON(w, http.StatusOK, info)
		return nil
	})
	handle("DELETE /blacklists/{name}/state", func(w http.ResponseWriter, r *http.Request) error {
		l, err := d.list(r)
		if err != nil {
			return err
		}
		if err := d.fromControl(l); err != nil {
			return err
		}
		var info listInfo
		if e := d.do(func(*control) { err = d.bl.Drop(l); info = d.listInfo(l) }); e != nil {
			return stoppingError(e)
		}
		var sw *blacklist.StateWriteError
		switch {
		case errors.As(err, &sw):
			return d.stateError(l, err)
		case err != nil:
			return daemon.Wrap(http.StatusInternalServerError, codeListFilesFailed,
				"the list's files cannot be loaded; the list in force and its pushed state stay", err)
		}
		d.Log.Info("blacklist's pushed state dropped through the admin API: back to its files", "list", l.Name(),
			"entries", info.Entries, "files", info.Files, "from", r.RemoteAddr)
		daemon.WriteJSON(w, http.StatusOK, info)
		return nil
	})
	return d.Auth.Wrap(mux)
}

// reloadError describes a failed reload: 422, code restart_required for a change
// only a restart applies, else reload_failed.
func reloadError(err error) *daemon.APIError {
	if errors.Is(err, errStopped) {
		return stoppingError(err)
	}
	var re *restartError
	if errors.As(err, &re) || errors.Is(err, l7.ErrRestartRequired) {
		return daemon.Wrap(http.StatusUnprocessableEntity, codeRestartRequired, "reload refused; the running configuration stays", err)
	}
	return daemon.Wrap(http.StatusUnprocessableEntity, codeReloadFailed, "reload failed; the running configuration stays", err)
}

// stateError describes a change refused because the list's state file could not be
// written or removed (500), and logs it.
func (d *Daemon) stateError(l *blacklist.List, err error) *daemon.APIError {
	e := daemon.Wrap(http.StatusInternalServerError, codeStateWriteFailed, "the list's state file could not be written; the list in force stays", err)
	if errors.Is(err, daemon.ErrNotDurable) {
		e.Message = ""
	}
	d.Log.Error("blacklist change through the admin API failed", "list", l.Name(), "err", e.Error())
	return e
}

// stoppingError answers a change asked of an l7d that is stopping (503).
func stoppingError(err error) *daemon.APIError {
	return daemon.Wrap(http.StatusServiceUnavailable, daemon.CodeUnavailable, "nothing was changed", err)
}

// list returns the list a request names, or a 404 error.
func (d *Daemon) list(r *http.Request) (*blacklist.List, error) {
	name := r.PathValue("name")
	if name != blacklist.GlobalName && !slices.Contains(d.listenerNames, name) {
		return nil, daemon.Errorf(http.StatusNotFound, codeUnknownList,
			"no list %q: a list is %q or a listener's name (%v)", name, blacklist.GlobalName, d.listenerNames)
	}
	return d.lists.Listener(name), nil
}

// uploader returns the Uploader of the admin API's blacklist uploads, counting in
// d.Reg when there is one.
func (d *Daemon) uploader() *blacklist.Uploader {
	var reg prometheus.Registerer
	if d.Reg != nil {
		reg = d.Reg
	}
	u, err := blacklist.NewUploader(reg)
	if err != nil {
		d.Log.Error("blacklist upload metrics not registered", "err", err)
		u, _ = blacklist.NewUploader(nil)
	}
	return u
}

// uploadLimit describes the limit an upload passed, in a too_large error.
type uploadLimit struct {
	Limit string `json:"limit"`
	Max   int64  `json:"max"`
}

// busyError answers an upload that waited too long for another (429, code busy,
// Retry-After), or whose client went away while it waited.
func busyError(w http.ResponseWriter, err error) *daemon.APIError {
	w.Header().Set("Retry-After", "1")
	return daemon.Wrap(http.StatusTooManyRequests, codeBusy, "upload refused; the list in force stays", err)
}

// uploadError describes a rejected upload: 413 when it passed a limit, else 422,
// with its bad lines when it is text.
func uploadError(err error) *daemon.APIError {
	var le *blacklist.LimitError
	if errors.As(err, &le) {
		e := daemon.Wrap(http.StatusRequestEntityTooLarge, daemon.CodeTooLarge, "upload refused; the list in force stays", le)
		e.Details = uploadLimit{Limit: "admin_blacklist_uploads." + le.Limit, Max: le.Max}
		return e
	}
	e := daemon.Wrap(http.StatusUnprocessableEntity, codeInvalidList, "upload rejected; the list in force stays", err)
	var pe *blacklist.ParseErrors
	if errors.As(err, &pe) {
		e.Code = codeBadLines
		details := badLines{BadLines: pe.Count}
		for _, l := range pe.Errors {
			details.Lines = append(details.Lines, badLine{Line: l.Line, Text: l.Text, Error: l.Err.Error()})
		}
		e.Details = details
	}
	return e
}
