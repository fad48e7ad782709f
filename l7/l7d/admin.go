package l7d

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// apiError is the one error shape of the admin API.
type apiError struct {
	Status  int    `json:"status"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// BadLines is how many lines of an upload were bad; Lines the first of them.
	BadLines int       `json:"bad_lines,omitempty"`
	Lines    []badLine `json:"lines,omitempty"`
}

type badLine struct {
	Line  int    `json:"line"`
	Text  string `json:"text"`
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) { writeJSON(w, e.Status, e) }

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
// stays), then swapped in atomically and answered 200 with the list's new size.
// With an admin token, every request but GET /healthz and GET /metrics must carry
// it (daemon.AdminAuth).
func (d *Daemon) adminHandler() http.Handler {
	mux := daemon.AdminMux(d.reg, d.srv.Healthy)
	mux.HandleFunc("/reload", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			http.Error(w, "use POST", http.StatusMethodNotAllowed)
			return
		}
		if err := d.Reload(); err != nil {
			http.Error(w, "reload failed; the running configuration stays: "+err.Error(), http.StatusUnprocessableEntity)
			return
		}
		io.WriteString(w, "reloaded\n")
	})
	mux.HandleFunc("GET /blacklists", func(w http.ResponseWriter, r *http.Request) {
		names := append([]string{blacklist.GlobalName}, d.lists.Names()...)
		out := make([]listInfo, 0, len(names))
		for _, n := range names {
			out = append(out, d.listInfo(d.lists.Listener(n)))
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("GET /blacklists/{name}", func(w http.ResponseWriter, r *http.Request) {
		if l := d.list(w, r); l != nil {
			writeJSON(w, http.StatusOK, d.listInfo(l))
		}
	})
	mux.HandleFunc("PUT /blacklists/{name}", func(w http.ResponseWriter, r *http.Request) {
		l := d.list(w, r)
		if l == nil {
			return
		}
		s, err := blacklist.Read(r.Body)
		if err != nil {
			writeError(w, uploadError(err))
			return
		}
		var info listInfo
		if e := d.do(func(*control) { err = d.bl.Replace(l, s); info = d.listInfo(l) }); e != nil {
			writeError(w, stoppingError())
			return
		}
		if err != nil {
			writeError(w, d.stateError(l, err))
			return
		}
		d.log.Info("blacklist replaced through the admin API", "list", l.Name(), "entries", info.Entries, "from", r.RemoteAddr)
		writeJSON(w, http.StatusOK, info)
	})
	mux.HandleFunc("POST /blacklists/{name}/delta", func(w http.ResponseWriter, r *http.Request) {
		l := d.list(w, r)
		if l == nil {
			return
		}
		delta, err := blacklist.ReadDelta(r.Body)
		if err != nil {
			writeError(w, uploadError(err))
			return
		}
		var info listInfo
		if e := d.do(func(*control) { err = d.bl.Apply(l, delta); info = d.listInfo(l) }); e != nil {
			writeError(w, stoppingError())
			return
		}
		var sw *blacklist.StateWriteError
		switch {
		case errors.As(err, &sw):
			writeError(w, d.stateError(l, err))
			return
		case err != nil:
			writeError(w, uploadError(err))
			return
		}
		d.log.Info("blacklist changed through the admin API", "list", l.Name(), "added", len(delta.Add),
			"removed", len(delta.Remove), "entries", info.Entries, "from", r.RemoteAddr)
		writeJSON(w, http.StatusOK, info)
	})
	mux.HandleFunc("DELETE /blacklists/{name}/state", func(w http.ResponseWriter, r *http.Request) {
		l := d.list(w, r)
		if l == nil {
			return
		}
		var err error
		var info listInfo
		if e := d.do(func(*control) { err = d.bl.Drop(l); info = d.listInfo(l) }); e != nil {
			writeError(w, stoppingError())
			return
		}
		var sw *blacklist.StateWriteError
		switch {
		case errors.As(err, &sw):
			writeError(w, d.stateError(l, err))
			return
		case err != nil:
			writeError(w, &apiError{Status: http.StatusInternalServerError, Code: "list_files_failed",
				Message: "the list's files cannot be loaded; the list in force and its pushed state stay: " + err.Error()})
			return
		}
		d.log.Info("blacklist's pushed state dropped through the admin API: back to its files", "list", l.Name(),
			"entries", info.Entries, "files", info.Files, "from", r.RemoteAddr)
		writeJSON(w, http.StatusOK, info)
	})
	return d.auth.Wrap(mux)
}

// stateError describes a change refused because the list's state file could not be
// written or removed (500), and logs it.
func (d *Daemon) stateError(l *blacklist.List, err error) *apiError {
	msg := "the list's state file could not be written; the list in force stays: " + err.Error()
	if errors.Is(err, daemon.ErrNotDurable) {
		msg = err.Error()
	}
	d.log.Error("blacklist change through the admin API failed", "list", l.Name(), "err", msg)
	return &apiError{Status: http.StatusInternalServerError, Code: "state_write_failed", Message: msg}
}

// stoppingError answers a change asked of an l7d that is stopping (503).
func stoppingError() *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Code: "stopping", Message: "l7d is stopping; nothing was changed"}
}

// list returns the list a request names, or answers 404 and returns nil.
func (d *Daemon) list(w http.ResponseWriter, r *http.Request) *blacklist.List {
	name := r.PathValue("name")
	if name != blacklist.GlobalName && !slices.Contains(d.listenerNames, name) {
		writeError(w, &apiError{Status: http.StatusNotFound, Code: "unknown_list",
			Message: fmt.Sprintf("no list %q: a list is %q or a listener's name (%v)", name, blacklist.GlobalName, d.listenerNames)})
		return nil
	}
	return d.lists.Listener(name)
}

// uploadError describes a rejected upload: 422, with its bad lines when it is text.
func uploadError(err error) *apiError {
	e := &apiError{Status: http.StatusUnprocessableEntity, Code: "invalid_list",
		Message: "upload rejected; the list in force stays: " + err.Error()}
	var pe *blacklist.ParseErrors
	if errors.As(err, &pe) {
		e.Code = "bad_lines"
		e.BadLines = pe.Count
		for _, l := range pe.Errors {
			e.Lines = append(e.Lines, badLine{Line: l.Line, Text: l.Text, Error: l.Err.Error()})
		}
	}
	return e
}
