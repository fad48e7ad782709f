package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
)

// Error codes of the API, besides the kit's (daemon.CodeBadRequest, …).
const (
	CodeConflict             = "conflict"              // 412: If-Match is not the object's revision
	CodePreconditionRequired = "precondition_required" // 428: a write without If-Match or If-None-Match
	CodeInvalid              = "invalid"               // 422: the object, or the snapshot it makes, is refused
	CodeForbidden            = "forbidden"             // 403: the token's role may not do this
	CodeNoSpace              = "no_space"              // 507: the store's quota is reached
	CodeNoRoute              = "no_route"              // 404: no such route
	CodeExists               = "exists"                // 409: a token of that name exists
	CodeCompacted            = "compacted"             // 410: the revision asked for was dropped by compaction
)

// Server is the /v1 API over a Store. It is an http.Handler.
type Server struct {
	st     *store.Store
	tokens *Tokens
	log    *slog.Logger
	routes []Route
	mux    *http.ServeMux
	certs  certState // the certificate routes' (certs.go)
}

// access is who may use a route.
type access int

const (
	accessRead  access = iota // any token
	accessWrite               // a role that writes the route's kind (per change for change sets)
	accessAdmin               // admin only
)

// Route is one operation of the API: the table the server registers and the
// OpenAPI document is generated from.
type Route struct {
	Method  string
	Path    string // with {name} for an object's name
	Kind    string // the model's kind, or "" for change sets and tokens
	Summary string
	// Role says who may call it, for the document.
	Role string
	// Query are its query parameters, for the document.
	Query  []QueryParam
	access access
	h      func(w http.ResponseWriter, r *http.Request, who Token) error
}

// QueryParam is a query parameter of a route, for the document.
type QueryParam struct {
	Name        string
	Type        string // "integer", "boolean" or "string"
	Description string
}

// New returns the API server over st, logging (and audit-logging writes) to log.
func New(st *store.Store, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{st: st, tokens: NewTokens(st), log: log, mux: http.NewServeMux()}
	for _, kind := range model.Kinds {
		wr := "admin or " + string(writers[kind])
		s.routes = append(s.routes,
			Route{Method: "GET", Path: "/v1/" + kind, Kind: kind, Summary: "List the " + kind + " objects", Role: "any", access: accessRead, h: s.list},
			Route{Method: "GET", Path: "/v1/" + kind + "/{name}", Kind: kind, Summary: "Get one object of " + kind + " (ETag: its revision)", Role: "any", access: accessRead, h: s.get},
			Route{Method: "PUT", Path: "/v1/" + kind + "/{name}", Kind: kind, Summary: "Create (If-None-Match: *) or replace (If-Match) one object of " + kind, Role: wr, access: accessWrite, h: s.put},
			Route{Method: "DELETE", Path: "/v1/" + kind + "/{name}", Kind: kind, Summary: "Delete one object of " + kind + " (If-Match)", Role: wr, access: accessWrite, h: s.delete},
		)
	}
	s.routes = append(s.routes,
		Route{Method: "POST", Path: "/v1/changesets", Summary: "Commit several puts and deletes in one transaction, or none (dry_run: check and answer the diff, store nothing)", Role: "a writer of every kind changed", access: accessRead, h: s.changeset,
			Query: []QueryParam{{Name: "dry_run", Type: "boolean", Description: "check the change set and answer the diff it would make, storing nothing"}}},
		Route{Method: "GET", Path: "/v1/tokens", Summary: "List the API tokens (names and roles)", Role: "admin", access: accessAdmin, h: s.listTokens},
		Route{Method: "POST", Path: "/v1/tokens", Summary: "Create an API token; its plaintext is answered once", Role: "admin", access: accessAdmin, h: s.createToken},
		Route{Method: "DELETE", Path: "/v1/tokens/{name}", Summary: "Delete an API token", Role: "admin", access: accessAdmin, h: s.deleteToken},
	)
	s.routes = append(s.routes, s.historyRoutes()...)
	s.routes = append(s.routes, s.nodeRoutes()...)
	s.routes = append(s.routes, s.blacklistRoutes()...)
	s.routes = s.certRoutes(s.routes)
	for _, rt := range s.routes {
		s.mux.Handle(rt.Method+" "+rt.Path, s.guard(rt))
	}
	s.mux.Handle("GET /v1/openapi.json", daemon.Handler(func(w http.ResponseWriter, r *http.Request) error {
		daemon.WriteJSON(w, http.StatusOK, s.OpenAPI())
		return nil
	}))
	s.mux.Handle("/", daemon.Handler(func(w http.ResponseWriter, r *http.Request) error {
		return daemon.Errorf(http.StatusNotFound, CodeNoRoute, "no route %s %s", r.Method, r.URL.Path)
	}))
	return s
}

// Routes returns the route table.
func (s *Server) Routes() []Route { return s.routes }

// Tokens returns the server's tokens.
func (s *Server) Tokens() *Tokens { return s.tokens }

// EnsureAdminToken makes a first admin token, named "admin", when there is no token
// at all, and returns its plaintext ("" when tokens exist).
func (s *Server) EnsureAdminToken(ctx context.Context) (string, error) {
	anyTok, err := s.tokens.Any(ctx)
	if err != nil || anyTok {
		return "", err
	}
	tok, err := s.tokens.Create(ctx, "admin", RoleAdmin)
	if errors.Is(err, ErrTokenExists) { // another controld made it first
		return "", nil
	}
	return tok, err
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// guard authenticates the request and checks the route's role.
func (s *Server) guard(rt Route) http.Handler {
	return daemon.Handler(func(w http.ResponseWriter, r *http.Request) error {
		auth := r.Header.Get("Authorization")
		presented, ok := strings.CutPrefix(auth, "Bearer ")
		if !ok {
			w.Header().Set("WWW-Authenticate", "Bearer")
			return daemon.Errorf(http.StatusUnauthorized, daemon.CodeUnauthorized, "a bearer token is required")
		}
		who, ok, err := s.tokens.Authenticate(r.Context(), strings.TrimSpace(presented))
		if err != nil {
			return daemon.Wrap(http.StatusServiceUnavailable, daemon.CodeUnavailable, "checking the token", err)
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			return daemon.Errorf(http.StatusUnauthorized, daemon.CodeUnauthorized, "the token is not valid")
		}
		switch {
		case rt.access == accessAdmin && who.Role != RoleAdmin,
			rt.access == accessWrite && !who.Role.CanWrite(rt.Kind):
			return daemon.Errorf(http.StatusForbidden, CodeForbidden, "role %s may not %s %s", who.Role, rt.Method, r.URL.Path)
		}
		return rt.h(w, r, who)
	})
}

// Item is an object as the API answers it in lists.
type Item struct {
	Name     string          `json:"name"`
	Revision int64           `json:"revision"`
	Object   json.RawMessage `json:"object"`
}

// List is the answer of GET /v1/{kind}.
type List struct {
	Revision int64  `json:"revision"`
	Items    []Item `json:"items"`
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, _ Token) error {
	kind := strings.TrimPrefix(r.URL.Path, "/v1/")
	objs, rev, err := s.st.List(r.Context(), kind)
	if err != nil {
		return storeError("listing "+kind, err)
	}
	out := List{Revision: rev, Items: make([]Item, 0, len(objs))}
	for _, o := range objs {
		out.Items = append(out.Items, Item{Name: o.Name, Revision: o.ModRevision, Object: o.Value})
	}
	daemon.WriteJSON(w, http.StatusOK, out)
	return nil
}

func kindOf(r *http.Request) string {
	k := strings.TrimPrefix(r.URL.Path, "/v1/")
	k, _, _ = strings.Cut(k, "/")
	return k
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, _ Token) error {
	kind, name := kindOf(r), r.PathValue("name")
	if err := store.CheckName(name); err != nil {
		return daemon.Wrap(http.StatusNotFound, daemon.CodeNotFound, kind+"/"+name, err)
	}
	o, err := s.st.Get(r.Context(), kind, name)
	if err != nil {
		return storeError("reading "+kind+"/"+name, err)
	}
	w.Header().Set("ETag", etag(o.ModRevision))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(o.Value)
	return nil
}

func etag(rev int64) string { return `"` + strconv.FormatInt(rev, 10) + `"` }

// precondition reads If-Match ("<revision>") or If-None-Match: * into a store
// revision. A write needs one of them.
func precondition(r *http.Request, create bool) (int64, error) {
	if im := strings.TrimSpace(r.Header.Get("If-Match")); im != "" {
		rev, err := strconv.ParseInt(strings.Trim(strings.TrimPrefix(im, "W/"), `"`), 10, 64)
		if err != nil || rev <= 0 {
			return 0, daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "If-Match %q: want the object's revision as its ETag gives it", im)
		}
		return rev, nil
	}
	if create && strings.TrimSpace(r.Header.Get("If-None-Match")) == "*" {
		return 0, nil
	}
	if create {
		return 0, daemon.Errorf(http.StatusPreconditionRequired, CodePreconditionRequired, "a write needs If-Match with the object's revision, or If-None-Match: * to create it")
	}
	return 0, daemon.Errorf(http.StatusPreconditionRequired, CodePreconditionRequired, "a delete needs If-Match with the object's revision")
}

func (s *Server) put(w http.ResponseWriter, r *http.Request, who Token) error {
	kind, name := kindOf(r), r.PathValue("name")
	if err := store.CheckName(name); err != nil {
		return daemon.Wrap(http.StatusBadRequest, daemon.CodeBadRequest, "name", err)
	}
	rev, err := precondition(r, true)
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if err := daemon.DecodeRequest(w, r, store.MaxValueBytes, &raw); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return daemon.Wrap(http.StatusBadRequest, daemon.CodeBadRequest, "body", err)
	}
	return s.commit(w, r, who, []store.Change{{Kind: kind, Name: name, Value: buf.Bytes(), IfRevision: rev}}, http.StatusOK)
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request, who Token) error {
	kind, name := kindOf(r), r.PathValue("name")
	if err := store.CheckName(name); err != nil {
		return daemon.Wrap(http.StatusNotFound, daemon.CodeNotFound, kind+"/"+name, err)
	}
	rev, err := precondition(r, false)
	if err != nil {
		return err
	}
	return s.commit(w, r, who, []store.Change{{Kind: kind, Name: name, Delete: true, IfRevision: rev}}, http.StatusOK)
}

// Committed is the answer of a write: the revision it committed at.
type Committed struct {
	Revision int64 `json:"revision"`
}

// commit writes changes in one checked change set, audit-logs it and answers.
func (s *Server) commit(w http.ResponseWriter, r *http.Request, who Token, changes []store.Change, status int) error {
	rev, err := s.commitSet(r, who, store.ChangeSet{Changes: changes})
	if err != nil {
		return storeError("committing", err)
	}
	if len(changes) == 1 && !changes[0].Delete {
		w.Header().Set("ETag", etag(rev))
	}
	daemon.WriteJSON(w, status, Committed{Revision: rev})
	return nil
}

// commitSet commits cs checked with the model (model.Check) and recorded as who's,
// and audit-logs each change.
func (s *Server) commitSet(r *http.Request, who Token, cs store.ChangeSet) (int64, error) {
	cs.Check, cs.Who = model.Check, who.Name
	rev, err := s.st.Commit(r.Context(), cs)
	for _, c := range cs.Changes {
		op := "put"
		if c.Delete {
			op = "delete"
		}
		attrs := []any{"token", who.Name, "role", who.Role, "method", r.Method, "path", r.URL.Path, "op", op, "kind", c.Kind, "name", c.Name, "if_revision", c.IfRevision}
		if err != nil {
			s.log.Info("audit: write refused", append(attrs, "err", err)...)
		} else {
			s.log.Info("audit: write", append(attrs, "revision", rev)...)
		}
	}
	return rev, err
}

// FieldProblem is one refused field in a 422's details.
type FieldProblem struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

// storeError maps the store's errors to the API's.
func storeError(what string, err error) error {
	var ce *store.ConflictError
	var ck *store.CheckError
	switch {
	case errors.As(err, &ck):
		return &daemon.APIError{Status: http.StatusUnprocessableEntity, Code: CodeInvalid,
			Message: "the change is refused: the configuration it makes is not valid", Err: err,
			Details: map[string]any{"errors": fieldProblems(ck.Err), "revision": ck.Revision}}
	case errors.As(err, &ce) && ce.Since > 0:
		return &daemon.APIError{Status: http.StatusPreconditionFailed, Code: CodeConflict, Message: what, Err: err,
			Details: map[string]any{"since": ce.Since}}
	case errors.As(err, &ce):
		return &daemon.APIError{Status: http.StatusPreconditionFailed, Code: CodeConflict, Message: what, Err: err,
			Details: map[string]any{"kind": ce.Kind, "name": ce.Name, "expected": ce.Expected, "actual": ce.Actual}}
	case errors.Is(err, store.ErrCompacted):
		return daemon.Wrap(http.StatusGone, CodeCompacted, what, err)
	case errors.Is(err, store.ErrNotFound):
		return daemon.Wrap(http.StatusNotFound, daemon.CodeNotFound, what, err)
	case errors.Is(err, store.ErrTooLarge):
		return daemon.Wrap(http.StatusRequestEntityTooLarge, daemon.CodeTooLarge, what, err)
	case errors.Is(err, store.ErrNoSpace):
		return daemon.Wrap(http.StatusInsufficientStorage, CodeNoSpace, what, err)
	case errors.Is(err, store.ErrClosed), errors.Is(err, context.Canceled):
		return daemon.Wrap(http.StatusServiceUnavailable, daemon.CodeUnavailable, what, err)
	}
	return daemon.Wrap(http.StatusInternalServerError, daemon.CodeInternal, what, err)
}

// fieldProblems flattens joined errors into their field paths.
func fieldProblems(err error) []FieldProblem {
	var out []FieldProblem
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		var fe *config.FieldError
		if errors.As(e, &fe) {
			msg := ""
			if fe.Err != nil {
				msg = fe.Err.Error()
			}
			out = append(out, FieldProblem{Path: fe.Path, Message: msg})
			return
		}
		out = append(out, FieldProblem{Message: e.Error()})
	}
	walk(err)
	return out
}

// ChangeSetRequest is the body of POST /v1/changesets.
type ChangeSetRequest struct {
	// Changes are the writes, at most store.MaxChanges.
	Changes []ChangeRequest `json:"changes"`
}

// ChangeRequest is one write of a change set.
type ChangeRequest struct {
	// Kind and Name name the object.
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Delete deletes it; otherwise Object is its new JSON.
	Delete bool            `json:"delete,omitempty"`
	Object json.RawMessage `json:"object,omitempty"`
	// IfRevision is the object's revision (its ETag), or 0 to create it. Required.
	IfRevision *int64 `json:"if_revision"`
}

func (s *Server) changeset(w http.ResponseWriter, r *http.Request, who Token) error {
	dryRun, err := boolQuery(r, "dry_run")
	if err != nil {
		return err
	}
	var req ChangeSetRequest
	if err := daemon.DecodeRequest(w, r, store.MaxChangeSetBytes+64<<10, &req); err != nil {
		return err
	}
	if len(req.Changes) == 0 {
		return daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "changes: at least one")
	}
	changes := make([]store.Change, 0, len(req.Changes))
	for i, c := range req.Changes {
		at := config.Index("changes", i)
		if _, ok := writers[c.Kind]; !ok {
			return daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "%s.kind: %q is not a kind of the model", at, c.Kind)
		}
		if !who.Role.CanWrite(c.Kind) {
			return daemon.Errorf(http.StatusForbidden, CodeForbidden, "%s: role %s may not write %s", at, who.Role, c.Kind)
		}
		if c.IfRevision == nil || *c.IfRevision < 0 {
			return daemon.Errorf(http.StatusPreconditionRequired, CodePreconditionRequired, "%s.if_revision: the object's revision, or 0 to create it, is required", at)
		}
		ch := store.Change{Kind: c.Kind, Name: c.Name, Delete: c.Delete, IfRevision: *c.IfRevision}
		if c.Delete {
			if len(c.Object) > 0 {
				return daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "%s: a delete has no object", at)
			}
		} else {
			var buf bytes.Buffer
			if len(c.Object) == 0 || json.Compact(&buf, c.Object) != nil {
				return daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "%s.object: a put needs the object's JSON", at)
			}
			ch.Value = buf.Bytes()
		}
		if err := store.CheckName(c.Name); err != nil {
			return daemon.Wrap(http.StatusBadRequest, daemon.CodeBadRequest, at+".name", err)
		}
		changes = append(changes, ch)
	}
	if dryRun {
		return s.dryRun(w, r, who, changes)
	}
	return s.commit(w, r, who, changes, http.StatusOK)
}

// TokenRequest is the body of POST /v1/tokens.
type TokenRequest struct {
	Name string `json:"name"`
	Role Role   `json:"role"`
}

// NewToken is the answer of POST /v1/tokens: the token's plaintext, shown once.
type NewToken struct {
	Name  string `json:"name"`
	Role  Role   `json:"role"`
	Token string `json:"token"`
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request, _ Token) error {
	toks, err := s.tokens.List(r.Context())
	if err != nil {
		return daemon.Wrap(http.StatusServiceUnavailable, daemon.CodeUnavailable, "", err)
	}
	daemon.WriteJSON(w, http.StatusOK, map[string]any{"tokens": toks})
	return nil
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request, who Token) error {
	var req TokenRequest
	if err := daemon.DecodeRequest(w, r, 4<<10, &req); err != nil {
		return err
	}
	if err := store.CheckName(req.Name); err != nil {
		return daemon.Wrap(http.StatusUnprocessableEntity, CodeInvalid, "name", err)
	}
	if !req.Role.Valid() {
		return daemon.Errorf(http.StatusUnprocessableEntity, CodeInvalid, "role %q: want one of %v", req.Role, Roles)
	}
	tok, err := s.tokens.Create(r.Context(), req.Name, req.Role)
	if errors.Is(err, ErrTokenExists) {
		return daemon.Wrap(http.StatusConflict, CodeExists, "", err)
	}
	if err != nil {
		return daemon.Wrap(http.StatusServiceUnavailable, daemon.CodeUnavailable, "", err)
	}
	s.log.Info("audit: token created", "token", who.Name, "method", r.Method, "kind", "tokens", "name", req.Name, "role", req.Role)
	daemon.WriteJSON(w, http.StatusCreated, NewToken{Name: req.Name, Role: req.Role, Token: tok})
	return nil
}

func (s *Server) deleteToken(w http.ResponseWriter, r *http.Request, who Token) error {
	name := r.PathValue("name")
	ok, err := s.tokens.Delete(r.Context(), name)
	if err != nil {
		return daemon.Wrap(http.StatusServiceUnavailable, daemon.CodeUnavailable, "", err)
	}
	if !ok {
		return daemon.Errorf(http.StatusNotFound, daemon.CodeNotFound, "no token %q", name)
	}
	s.log.Info("audit: token deleted", "token", who.Name, "method", r.Method, "kind", "tokens", "name", name)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// String describes a route, "GET /v1/pools".
func (rt Route) String() string { return fmt.Sprintf("%s %s", rt.Method, rt.Path) }
