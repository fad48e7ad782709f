package api

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/daemon"
)

// historyRoutes are the routes of the configuration's history: its revisions, the
// diff between two, and the rollback to one.
func (s *Server) historyRoutes() []Route {
	return []Route{
		{Method: "GET", Path: "/v1/revisions", Summary: "List the configuration's writes, newest first: revision, time, who and the objects changed", Role: "any", access: accessRead, h: s.revisions,
			Query: []QueryParam{{Name: "limit", Type: "integer", Description: "how many (default 20, at most 1000)"}}},
		{Method: "GET", Path: "/v1/revisions/{revision}", Summary: "One write of the configuration", Role: "any", access: accessRead, h: s.revision},
		{Method: "GET", Path: "/v1/diff", Summary: "The objects that differ from one revision to another, with their values before and after", Role: "any", access: accessRead, h: s.diff,
			Query: []QueryParam{
				{Name: "from", Type: "integer", Description: "the earlier revision (required)"},
				{Name: "to", Type: "integer", Description: "the later revision (default: now)"},
			}},
		{Method: "POST", Path: "/v1/rollback", Summary: "Make the objects equal to those at an earlier revision, in one change set (expect_revision: the revision the caller saw; 412 when the configuration moved on, 410 when the revision was compacted)", Role: "a writer of every kind changed", access: accessRead, h: s.rollback},
	}
}

// Revisions is the answer of GET /v1/revisions.
type Revisions struct {
	Revisions []store.Revision `json:"revisions"`
}

func (s *Server) revisions(w http.ResponseWriter, r *http.Request, _ Token) error {
	limit, err := intQuery(r, "limit", 0)
	if err != nil {
		return err
	}
	if limit < 0 {
		return daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "limit %d: want 1 to %d", limit, store.MaxRevisions)
	}
	revs, err := s.st.Revisions(r.Context(), int(limit))
	if err != nil {
		return storeError("reading the revisions", err)
	}
	daemon.WriteJSON(w, http.StatusOK, Revisions{Revisions: revs})
	return nil
}

func (s *Server) revision(w http.ResponseWriter, r *http.Request, _ Token) error {
	rev, err := pathRevision(r)
	if err != nil {
		return err
	}
	got, err := s.st.RevisionAt(r.Context(), rev)
	if err != nil {
		return storeError("revision "+strconv.FormatInt(rev, 10), err)
	}
	daemon.WriteJSON(w, http.StatusOK, got)
	return nil
}

// DiffChange is one object that differs, in a diff, a dry run or a rollback.
type DiffChange struct {
	// Op is "put" (created or changed) or "delete".
	Op   string `json:"op"`
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Before and After are the object's JSON before and after; absent where the
	// object is.
	Before json.RawMessage `json:"before,omitempty"`
	After  json.RawMessage `json:"after,omitempty"`
}

// Diff is the answer of GET /v1/diff.
type Diff struct {
	From    int64        `json:"from"`
	To      int64        `json:"to"`
	Changes []DiffChange `json:"changes"`
}

// diffChanges converts the store's differences.
func diffChanges(ds []store.Difference) []DiffChange {
	out := make([]DiffChange, 0, len(ds))
	for _, d := range ds {
		c := DiffChange{Op: d.Op, Kind: d.Kind, Name: d.Name}
		if d.Before != nil {
			c.Before = d.Before.Value
		}
		if d.After != nil {
			c.After = d.After.Value
		}
		out = append(out, c)
	}
	return out
}

func (s *Server) diff(w http.ResponseWriter, r *http.Request, _ Token) error {
	from, err := intQuery(r, "from", 0)
	if err != nil {
		return err
	}
	if from <= 0 {
		return daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "from: the earlier revision is required (a revision above 0)")
	}
	to, err := intQuery(r, "to", 0)
	if err != nil {
		return err
	}
	if to < 0 {
		return daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "to %d: want a revision above 0, or none for now", to)
	}
	before, err := s.st.SnapshotAt(r.Context(), from)
	if err != nil {
		return storeError("reading revision "+strconv.FormatInt(from, 10), err)
	}
	var after *store.Snapshot
	if to == 0 {
		after, err = s.st.Snapshot(r.Context())
	} else {
		after, err = s.st.SnapshotAt(r.Context(), to)
	}
	if err != nil {
		return storeError("reading revision "+strconv.FormatInt(to, 10), err)
	}
	daemon.WriteJSON(w, http.StatusOK, Diff{From: from, To: after.Revision, Changes: diffChanges(store.Diff(before, after))})
	return nil
}

// DryRun is the answer of POST /v1/changesets?dry_run=true: the change set was
// checked against the configuration at Revision and would make Changes; nothing
// was stored.
type DryRun struct {
	DryRun   bool         `json:"dry_run"`
	Revision int64        `json:"revision"`
	Changes  []DiffChange `json:"changes"`
}

// dryRun checks changes as a commit would and answers the diff they would make.
func (s *Server) dryRun(w http.ResponseWriter, r *http.Request, who Token, changes []store.Change) error {
	p, err := s.st.DryRun(r.Context(), store.ChangeSet{Changes: changes, Check: model.Check})
	if err != nil {
		return storeError("checking the change set", err)
	}
	s.log.Debug("change set checked (dry run)", "token", who.Name, "changes", len(changes), "revision", p.Before.Revision)
	daemon.WriteJSON(w, http.StatusOK, DryRun{DryRun: true, Revision: p.Before.Revision, Changes: diffChanges(store.Diff(p.Before, p.After))})
	return nil
}

// RevisionRollbackRequest is the body of POST /v1/rollback.
type RevisionRollbackRequest struct {
	// Revision is the revision whose objects are to be in force again. Required.
	Revision int64 `json:"revision"`
	// ExpectRevision is the revision of the configuration the caller saw (the
	// newest of GET /v1/revisions): the rollback is refused (412) when the
	// configuration was written after it. Required.
	ExpectRevision *int64 `json:"expect_revision"`
	// DryRun checks the rollback and answers its changes, writing nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// RevisionRollback is the answer of POST /v1/rollback.
type RevisionRollback struct {
	// Revision is the revision the rollback committed at; the configuration's
	// revision when there was nothing to change or for a dry run.
	Revision int64 `json:"revision"`
	// To is the revision rolled back to.
	To     int64 `json:"to"`
	DryRun bool  `json:"dry_run,omitempty"`
	// Changes are the objects it changed (or would).
	Changes []DiffChange `json:"changes"`
}

func (s *Server) rollback(w http.ResponseWriter, r *http.Request, who Token) error {
	var req RevisionRollbackRequest
	if err := daemon.DecodeRequest(w, r, 4<<10, &req); err != nil {
		return err
	}
	if req.Revision <= 0 {
		return daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "revision: the revision to roll back to is required (above 0)")
	}
	if req.ExpectRevision == nil || *req.ExpectRevision <= 0 {
		return daemon.Errorf(http.StatusPreconditionRequired, CodePreconditionRequired, "expect_revision: the configuration's revision the rollback is made against is required")
	}
	since := *req.ExpectRevision
	ctx := r.Context()
	at, err := s.st.SnapshotAt(ctx, req.Revision)
	if err != nil {
		return storeError("reading revision "+strconv.FormatInt(req.Revision, 10), err)
	}
	now, err := s.st.Snapshot(ctx)
	if err != nil {
		return storeError("reading the configuration", err)
	}
	head, err := s.st.Head(ctx)
	if err != nil {
		return storeError("reading the configuration", err)
	}
	if head > since {
		return storeError("rolling back", &store.ConflictError{Since: since})
	}
	changes := store.RollbackChanges(now, at)
	for _, c := range changes {
		if !who.Role.CanWrite(c.Kind) {
			return daemon.Errorf(http.StatusForbidden, CodeForbidden, "role %s may not write %s, which the rollback changes (%s/%s)", who.Role, c.Kind, c.Kind, c.Name)
		}
	}
	out := RevisionRollback{Revision: head, To: req.Revision, DryRun: req.DryRun, Changes: diffChanges(store.Diff(now, at))}
	if len(changes) == 0 {
		daemon.WriteJSON(w, http.StatusOK, out)
		return nil
	}
	cs := store.ChangeSet{Changes: changes, Since: since}
	if req.DryRun {
		cs.Check = model.Check
		if _, err := s.st.DryRun(ctx, cs); err != nil {
			return storeError("checking the rollback", err)
		}
		daemon.WriteJSON(w, http.StatusOK, out)
		return nil
	}
	rev, err := s.commitSet(r, who, cs)
	if err != nil {
		return storeError("rolling back to revision "+strconv.FormatInt(req.Revision, 10), err)
	}
	s.log.Info("audit: rollback", "token", who.Name, "role", who.Role, "to", req.Revision, "revision", rev, "changes", len(changes))
	out.Revision = rev
	daemon.WriteJSON(w, http.StatusOK, out)
	return nil
}

// intQuery returns the integer query parameter name, def when absent.
func intQuery(r *http.Request, name string, def int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "%s %q: want an integer", name, v)
	}
	return n, nil
}

// boolQuery returns the boolean query parameter name, false when absent.
func boolQuery(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "%s %q: want true or false", name, v)
	}
	return b, nil
}

// pathRevision returns the {revision} of the path.
func pathRevision(r *http.Request) (int64, error) {
	v := r.PathValue("revision")
	rev, err := strconv.ParseInt(v, 10, 64)
	if err != nil || rev <= 0 {
		return 0, daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "revision %q: want a revision above 0", v)
	}
	return rev, nil
}
