package api

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// Error codes of blacklist pushes.
const (
	CodeBadLines   = "bad_lines"   // 422: lines of a push are refused, each by its number; nothing changed
	CodeBusy       = "busy"        // 429: another push is being read (Retry-After)
	CodeInProgress = "in_progress" // 409: a push with the same Idempotency-Key is under way
)

// Keys of the blacklist routes' records, outside the objects' prefix, under a
// lease of OperationTTL.
const (
	// OperationPrefix holds each push's operation: /tiergate/operations/v1/<id>.
	OperationPrefix = "/tiergate/operations/v1/"
	// IdempotencyPrefix holds the first answer of each Idempotency-Key, by the
	// SHA-256 of the token's name, the route and the key.
	IdempotencyPrefix = "/tiergate/idempotency/v1/"
	// OperationTTL is how long operations and idempotency keys are kept.
	OperationTTL = 24 * time.Hour
	// AsyncEntries is the size past which a whole list is stored after the answer
	// (202 with an operation to poll) rather than before it.
	AsyncEntries = 100_000
	// asyncTimeout bounds the storing of a list answered 202.
	asyncTimeout = 10 * time.Minute
)

// States of an operation.
const (
	OpPending = "pending" // not stored yet, or stored and not yet applied by every node
	OpApplied = "applied" // stored, and every node that enforces blacklists applied it
	OpFailed  = "failed"  // not stored: Error says why
)

// blacklistAPI is the state of the blacklist routes.
type blacklistAPI struct {
	s      *Server
	w      *blsync.Writer
	up     *blacklist.Uploader
	limits blacklist.UploadLimits
}

// blacklistRoutes are the routes of the blacklists (control/blsync) and their
// operations.
func (s *Server) blacklistRoutes() []Route {
	up, _ := blacklist.NewUploader(nil)
	b := &blacklistAPI{s: s, w: blsync.NewWriter(s.st, blsync.WriterConfig{Logger: s.log}), up: up}
	b.limits.Defaults()
	const kind, wr = "blacklists", "admin or risk-engine"
	return []Route{
		{Method: "GET", Path: "/v1/blacklists", Kind: kind, Summary: "Every blacklist: version, entries, chunks, deltas, last write", Role: "any", access: accessRead, h: b.list},
		{Method: "GET", Path: "/v1/blacklists/{name}", Kind: kind, Summary: "One blacklist, with the version each node enforces and how many applied the latest", Role: "any", access: accessRead, h: b.show},
		{Method: "PUT", Path: "/v1/blacklists/{name}", Kind: kind, Summary: "Replace a whole blacklist: text, the policy/blacklist binary format, gzip, or NDJSON (Content-Type application/x-ndjson); over 100,000 entries answers 202 with an operation; Idempotency-Key", Role: wr, access: accessRead, h: b.replace},
		{Method: "POST", Path: "/v1/blacklists/{name}/delta", Kind: kind, Summary: "Add and remove entries: NDJSON lines ({ip|cidr, expires|duration, reason, op}) or text delta lines (+/-); Idempotency-Key", Role: wr, access: accessRead, h: b.delta},
		{Method: "GET", Path: "/v1/operations/{id}", Kind: kind, Summary: "A push's operation: pending, applied on N of M nodes, or failed and why", Role: "any", access: accessRead, h: b.operation},
		b.decisionsRoute(),
	}
}

// canPush refuses a token that may not write blacklists.
func canPush(r *http.Request, who Token) error {
	if who.Role != RoleAdmin && who.Role != RoleRiskEngine {
		return daemon.Errorf(http.StatusForbidden, CodeForbidden, "role %s may not %s %s: blacklists are written by admin or risk-engine", who.Role, r.Method, r.URL.Path)
	}
	return nil
}

// BlacklistInfo is a blacklist in GET /v1/blacklists and GET /v1/blacklists/{name}.
type BlacklistInfo struct {
	Name    string `json:"name"`
	Version int64  `json:"version"`
	// Entries is the list's size (its base's entries and the deltas' additions
	// less their removals, until the next compaction).
	Entries     int64     `json:"entries"`
	BaseVersion int64     `json:"base_version"`
	Chunks      int       `json:"chunks"`
	Bytes       int64     `json:"bytes"`
	Deltas      int64     `json:"deltas"`
	DeltaBytes  int64     `json:"delta_bytes"`
	Updated     time.Time `json:"updated"`
	Who         string    `json:"who,omitempty"`
	// Nodes, in a show, is the version each node enforces; Applied how many of
	// NodesTotal enforce the latest.
	Nodes      []BlacklistNode `json:"nodes,omitempty"`
	Applied    int             `json:"applied"`
	NodesTotal int             `json:"nodes_total"`
	// Hits, in a show, is the sum of the nodes' hits of the list (those still
	// reporting and those lost alike).
	Hits uint64 `json:"hits"`
}

// BlacklistNode is a node in a blacklist's show.
type BlacklistNode struct {
	Node    string `json:"node"`
	Role    string `json:"role"`
	Version int64  `json:"version"`
	// State is applied (the latest version), behind, or lost (no longer reports).
	State string `json:"state"`
	// Hits is the addresses the list refused on the node since it started, as of
	// its last status (agent.Status.BlacklistHits, written every few seconds).
	Hits uint64 `json:"hits"`
}

func info(m *blsync.Manifest) BlacklistInfo {
	return BlacklistInfo{Name: m.Name, Version: m.Version, Entries: m.Entries, BaseVersion: m.Base.Version,
		Chunks: len(m.Base.Chunks), Bytes: m.Base.Bytes, Deltas: m.Deltas.Count(), DeltaBytes: m.Deltas.Bytes,
		Updated: m.Updated, Who: m.Who}
}

func (b *blacklistAPI) list(w http.ResponseWriter, r *http.Request, _ Token) error {
	ms, err := b.w.Lists(r.Context())
	if err != nil {
		return storeError("listing the blacklists", err)
	}
	out := make([]BlacklistInfo, 0, len(ms))
	for _, m := range ms {
		out = append(out, info(m))
	}
	daemon.WriteJSON(w, http.StatusOK, map[string]any{"lists": out})
	return nil
}

func (b *blacklistAPI) show(w http.ResponseWriter, r *http.Request, _ Token) error {
	name := r.PathValue("name")
	m, err := b.w.Show(r.Context(), name)
	if err != nil {
		return storeError("blacklist "+name, err)
	}
	out := info(m)
	nodes, applied, total, err := b.nodeVersions(r.Context(), name, m.Version)
	if err != nil {
		return storeError("reading the nodes", err)
	}
	out.Nodes, out.Applied, out.NodesTotal = nodes, applied, total
	for _, n := range nodes {
		out.Hits += n.Hits
	}
	daemon.WriteJSON(w, http.StatusOK, out)
	return nil
}

// follows reports whether a node enforces blacklists: it reports some, or it is
// an l7d or l4d.
func follows(st agent.Status, name string) bool {
	_, ok := st.Blacklists[name]
	return ok || len(st.Blacklists) > 0 || st.Role == "l7d" || st.Role == "l4d"
}

// nodeVersions returns the version of list name each node enforces, and how many
// of the nodes that report enforce version v or later.
func (b *blacklistAPI) nodeVersions(ctx context.Context, name string, v int64) ([]BlacklistNode, int, int, error) {
	ns, _, err := b.s.readNodes(ctx)
	if err != nil {
		return nil, 0, 0, err
	}
	var out []BlacklistNode
	applied, total := 0, 0
	for _, n := range ns {
		if !follows(n.st, name) {
			continue
		}
		bn := BlacklistNode{Node: n.st.Node, Role: n.st.Role, Version: n.st.Blacklists[name], Hits: n.st.BlacklistHits[name]}
		switch {
		case !n.live:
			bn.State = "lost"
		case bn.Version >= v:
			bn.State = "applied"
			applied++
			total++
		default:
			bn.State = "behind"
			total++
		}
		out = append(out, bn)
	}
	return out, applied, total, nil
}

// PushResult is the answer of a push: 200 once stored, 202 with the operation
// to poll for a large list stored after the answer.
type PushResult struct {
	List string `json:"list"`
	// Version is the list's new version; 0 in a 202 (the operation gives it).
	Version int64 `json:"version,omitempty"`
	// Entries is what the push held: a whole list's entries, a delta's additions
	// and removals.
	Entries int `json:"entries"`
	Added   int `json:"added,omitempty"`
	Removed int `json:"removed,omitempty"`
	// Operation is the push's operation, GET /v1/operations/{id}.
	Operation string `json:"operation"`
	// State is "stored", or "pending" in a 202.
	State string `json:"state"`
}

// Operation is a push's record and, at GET /v1/operations/{id}, where it stands.
type Operation struct {
	ID      string    `json:"id"`
	List    string    `json:"list"`
	Kind    string    `json:"kind"` // replace or delta
	Who     string    `json:"who"`
	Entries int       `json:"entries"`
	Created time.Time `json:"created"`
	// Version is the list's version the push made, 0 until it is stored.
	Version int64 `json:"version,omitempty"`
	// Error says why the push failed.
	Error string `json:"error,omitempty"`
	// Stored says the push is in the store (its record).
	Stored bool `json:"stored"`

	// State is pending, applied or failed; Message says it in words ("applied on 2
	// of 3 nodes", "failed: …"); Applied of Nodes enforce Version or later.
	State   string `json:"state"`
	Message string `json:"message"`
	Applied int    `json:"applied"`
	Nodes   int    `json:"nodes"`
}

// newOperation returns a new operation's record.
func newOperation(list, kind, who string, entries int) *Operation {
	var id [12]byte
	rand.Read(id[:])
	return &Operation{ID: hex.EncodeToString(id[:]), List: list, Kind: kind, Who: who, Entries: entries, Created: time.Now().UTC()}
}

// saveOperation writes an operation's record under a lease of OperationTTL.
func (b *blacklistAPI) saveOperation(ctx context.Context, op *Operation) error {
	rec := *op
	rec.State, rec.Message, rec.Applied, rec.Nodes = "", "", 0, 0
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	cli := b.s.st.Client()
	lease, err := cli.Grant(ctx, int64(OperationTTL/time.Second))
	if err != nil {
		return fmt.Errorf("recording operation %s: %w", op.ID, err)
	}
	if _, err := cli.Put(ctx, OperationPrefix+op.ID, string(data), clientv3.WithLease(lease.ID)); err != nil {
		return fmt.Errorf("recording operation %s: %w", op.ID, err)
	}
	return nil
}

func (b *blacklistAPI) operation(w http.ResponseWriter, r *http.Request, _ Token) error {
	id := r.PathValue("id")
	if len(id) != 24 || strings.Trim(id, "0123456789abcdef") != "" {
		return daemon.Errorf(http.StatusNotFound, daemon.CodeNotFound, "no operation %q", id)
	}
	resp, err := b.s.st.Client().Get(r.Context(), OperationPrefix+id)
	if err != nil {
		return storeError("reading operation "+id, err)
	}
	if len(resp.Kvs) == 0 {
		return daemon.Errorf(http.StatusNotFound, daemon.CodeNotFound, "no operation %q (operations are kept %v)", id, OperationTTL)
	}
	var op Operation
	if err := json.Unmarshal(resp.Kvs[0].Value, &op); err != nil {
		return daemon.Wrap(http.StatusInternalServerError, daemon.CodeInternal, "operation "+id, err)
	}
	switch {
	case op.Error != "":
		op.State, op.Message = OpFailed, "failed: "+op.Error
	case !op.Stored:
		op.State, op.Message = OpPending, "being stored"
	default:
		_, applied, total, err := b.nodeVersions(r.Context(), op.List, op.Version)
		if err != nil {
			return storeError("reading the nodes", err)
		}
		op.Applied, op.Nodes = applied, total
		op.State, op.Message = OpPending, fmt.Sprintf("applied on %d of %d nodes", applied, total)
		if applied == total {
			op.State = OpApplied
		}
	}
	daemon.WriteJSON(w, http.StatusOK, op)
	return nil
}

// idemAnswer is a push's answer, as remembered for its Idempotency-Key.
type idemAnswer struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body,omitempty"`
	// InProgress marks a key whose first push is under way.
	InProgress bool `json:"in_progress,omitempty"`
}

// idempotent runs a push once per Idempotency-Key: the first idemAnswer (a success)
// is kept OperationTTL and given again to a push with the same key, route and
// token (Idempotent-Replayed: true); a push while the first is under way is
// refused 409 in_progress. A push that failed may be retried with the same key.
// Without the header, do just runs.
func (b *blacklistAPI) idempotent(w http.ResponseWriter, r *http.Request, who Token, do func() (int, any, error)) error {
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if key == "" {
		status, body, err := do()
		if err != nil {
			return err
		}
		daemon.WriteJSON(w, status, body)
		return nil
	}
	if len(key) > 255 {
		return daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "Idempotency-Key: %d bytes, want at most 255", len(key))
	}
	h := sha256.Sum256([]byte(who.Name + "\n" + r.Method + " " + r.URL.Path + "\n" + key))
	k := IdempotencyPrefix + hex.EncodeToString(h[:])
	cli := b.s.st.Client()
	ctx := r.Context()
	lease, err := cli.Grant(ctx, int64(OperationTTL/time.Second))
	if err != nil {
		return storeError("recording the Idempotency-Key", err)
	}
	pending, _ := json.Marshal(idemAnswer{InProgress: true})
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(pending), clientv3.WithLease(lease.ID))).
		Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return storeError("recording the Idempotency-Key", err)
	}
	if !resp.Succeeded {
		cli.Revoke(context.WithoutCancel(ctx), lease.ID)
		var a idemAnswer
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 || json.Unmarshal(kvs[0].Value, &a) != nil {
			return daemon.Errorf(http.StatusConflict, CodeInProgress, "Idempotency-Key %q: try again", key)
		}
		if a.InProgress {
			w.Header().Set("Retry-After", "1")
			return daemon.Errorf(http.StatusConflict, CodeInProgress, "a push with Idempotency-Key %q is under way", key)
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.Status)
		w.Write(a.Body)
		return nil
	}
	status, body, err := do()
	if err != nil {
		cli.Delete(context.WithoutCancel(ctx), k)
		return err
	}
	data, jerr := json.Marshal(body)
	if jerr == nil {
		rec, _ := json.Marshal(idemAnswer{Status: status, Body: data})
		if _, err := cli.Put(context.WithoutCancel(ctx), k, string(rec), clientv3.WithLease(lease.ID)); err != nil {
			b.s.log.Warn("blacklist: recording the idemAnswer of an Idempotency-Key", "err", err)
		}
	}
	daemon.WriteJSON(w, status, body)
	return nil
}

// isNDJSON reports whether the request's Content-Type is NDJSON.
func isNDJSON(r *http.Request) bool {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return slices.Contains([]string{"application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines"}, mt)
}

// ndjsonBody is a request's NDJSON body, gunzipped when it is gzip (by
// Content-Encoding or its magic), within the text limit.
func (b *blacklistAPI) ndjsonBody(body io.Reader) (io.Reader, error) {
	br := bufio.NewReader(body)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, daemon.Wrap(http.StatusBadRequest, daemon.CodeBadRequest, "gzip", err)
		}
		return &capped{r: zr, left: b.limits.MaxTextBytes, max: b.limits.MaxTextBytes}, nil
	}
	return br, nil
}

// capped fails once more than max bytes came through it.
type capped struct {
	r         io.Reader
	left, max int64
}

func (c *capped) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return n, &blacklist.LimitError{Limit: "max_text_bytes", Max: c.max}
	}
	return n, err
}

// pushError describes a refused push: 413 over a limit, 422 bad_lines with each
// bad line, 429 busy.
func pushError(w http.ResponseWriter, err error) error {
	var le *blacklist.LimitError
	var pe *blacklist.ParseErrors
	var ae *daemon.APIError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &le):
		e := daemon.Wrap(http.StatusRequestEntityTooLarge, daemon.CodeTooLarge, "push refused; nothing changed", le)
		e.Details = map[string]any{"limit": le.Limit, "max": le.Max}
		return e
	case errors.As(err, &pe):
		lines := make([]map[string]any, 0, len(pe.Errors))
		for _, l := range pe.Errors {
			lines = append(lines, map[string]any{"line": l.Line, "text": l.Text, "error": l.Err.Error()})
		}
		return &daemon.APIError{Status: http.StatusUnprocessableEntity, Code: CodeBadLines, Message: "push refused; nothing changed", Err: err,
			Details: map[string]any{"bad_lines": pe.Count, "lines": lines}}
	case errors.Is(err, blacklist.ErrBusy):
		w.Header().Set("Retry-After", "1")
		return daemon.Wrap(http.StatusTooManyRequests, CodeBusy, "push refused; nothing changed", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return daemon.Wrap(http.StatusServiceUnavailable, daemon.CodeUnavailable, "push refused; nothing changed", err)
	}
	return daemon.Wrap(http.StatusUnprocessableEntity, CodeBadLines, "push refused; nothing changed", err)
}

// read reads a push's body one at a time with the other pushes: NDJSON, or what
// policy/blacklist reads (text, binary, gzip).
func (b *blacklistAPI) read(w http.ResponseWriter, r *http.Request, delta bool) (*blsync.NDJSON, *blacklist.Set, error) {
	release, err := b.up.Acquire(r.Context(), b.limits)
	if err != nil {
		return nil, nil, pushError(w, err)
	}
	defer release()
	body := http.MaxBytesReader(w, r.Body, b.limits.MaxBodyBytes)
	if isNDJSON(r) {
		in, err := b.ndjsonBody(body)
		if err != nil {
			return nil, nil, pushError(w, err)
		}
		nd, err := blsync.ParseNDJSON(in, delta, time.Now(), b.limits.MaxEntries)
		if err != nil {
			return nil, nil, readError(w, err)
		}
		return nd, nil, nil
	}
	if delta {
		d, err := b.up.ReadDelta(body, b.limits)
		if err != nil {
			return nil, nil, readError(w, err)
		}
		return &blsync.NDJSON{Delta: *d}, nil, nil
	}
	s, err := b.up.Read(body, b.limits)
	if err != nil {
		return nil, nil, readError(w, err)
	}
	return nil, s, nil
}

// readError maps a body over http.MaxBytesReader's limit to 413, others as
// pushError.
func readError(w http.ResponseWriter, err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return daemon.Errorf(http.StatusRequestEntityTooLarge, daemon.CodeTooLarge, "push refused; nothing changed: request body over %d bytes", mbe.Limit)
	}
	return pushError(w, err)
}

func (b *blacklistAPI) replace(w http.ResponseWriter, r *http.Request, who Token) error {
	if err := canPush(r, who); err != nil {
		return err
	}
	name := r.PathValue("name")
	if err := blsync.CheckName(name); err != nil {
		return daemon.Wrap(http.StatusBadRequest, daemon.CodeBadRequest, "name", err)
	}
	return b.idempotent(w, r, who, func() (int, any, error) {
		nd, set, err := b.read(w, r, false)
		if err != nil {
			return 0, nil, err
		}
		n := 0
		if nd != nil {
			var bld blacklist.Builder
			for _, e := range nd.Delta.Add {
				bld.Add(e.Prefix, e.Expires)
			}
			n = len(nd.Delta.Add)
			set = bld.Build()
		} else {
			n = set.Len()
		}
		op := newOperation(name, "replace", who.Name, n)
		if n > AsyncEntries {
			if err := b.saveOperation(r.Context(), op); err != nil {
				return 0, nil, storeError("recording the operation", err)
			}
			go b.store(op, func(ctx context.Context) (int64, error) { return b.w.Replace(ctx, name, set, who.Name) })
			b.audit(r, who, name, op, 0, nil)
			w.Header().Set("Location", "/v1/operations/"+op.ID)
			return http.StatusAccepted, PushResult{List: name, Entries: n, Operation: op.ID, State: OpPending}, nil
		}
		v, err := b.w.Replace(r.Context(), name, set, who.Name)
		b.audit(r, who, name, op, v, err)
		if err != nil {
			return 0, nil, storeError("storing blacklist "+name, err)
		}
		op.Version, op.Stored = v, true
		if err := b.saveOperation(r.Context(), op); err != nil {
			b.s.log.Warn("blacklist: recording an operation", "operation", op.ID, "err", err)
		}
		return http.StatusOK, PushResult{List: name, Version: v, Entries: n, Operation: op.ID, State: "stored"}, nil
	})
}

// store runs a push answered 202 and records its outcome in its operation.
func (b *blacklistAPI) store(op *Operation, write func(context.Context) (int64, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), asyncTimeout)
	defer cancel()
	v, err := write(ctx)
	if err != nil {
		op.Error = err.Error()
		b.s.log.Warn("audit: blacklist push failed", "operation", op.ID, "list", op.List, "token", op.Who, "err", err)
	} else {
		op.Version, op.Stored = v, true
		b.s.log.Info("audit: blacklist stored", "operation", op.ID, "list", op.List, "token", op.Who, "version", v)
	}
	if err := b.saveOperation(ctx, op); err != nil {
		b.s.log.Warn("blacklist: recording an operation", "operation", op.ID, "err", err)
	}
}

// audit logs a push.
func (b *blacklistAPI) audit(r *http.Request, who Token, name string, op *Operation, v int64, err error) {
	attrs := []any{"token", who.Name, "role", who.Role, "method", r.Method, "path", r.URL.Path, "kind", "blacklists", "name", name,
		"op", op.Kind, "entries", op.Entries, "operation", op.ID}
	switch {
	case err != nil:
		b.s.log.Info("audit: write refused", append(attrs, "err", err)...)
	case v == 0:
		b.s.log.Info("audit: write accepted, storing", attrs...)
	default:
		b.s.log.Info("audit: write", append(attrs, "version", v)...)
	}
}

func (b *blacklistAPI) delta(w http.ResponseWriter, r *http.Request, who Token) error {
	if err := canPush(r, who); err != nil {
		return err
	}
	name := r.PathValue("name")
	if err := blsync.CheckName(name); err != nil {
		return daemon.Wrap(http.StatusBadRequest, daemon.CodeBadRequest, "name", err)
	}
	return b.idempotent(w, r, who, func() (int, any, error) {
		nd, _, err := b.read(w, r, true)
		if err != nil {
			return 0, nil, err
		}
		d := &nd.Delta
		n := len(d.Add) + len(d.Remove)
		if n == 0 {
			return 0, nil, daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "an empty delta: nothing to add or remove")
		}
		op := newOperation(name, "delta", who.Name, n)
		v, err := b.w.DeltaMeta(r.Context(), name, d, blsync.Meta{Who: who.Name, Reasons: nd.Reasons})
		b.audit(r, who, name, op, v, err)
		if err != nil {
			return 0, nil, storeError("storing a delta of blacklist "+name, err)
		}
		op.Version, op.Stored = v, true
		if err := b.saveOperation(r.Context(), op); err != nil {
			b.s.log.Warn("blacklist: recording an operation", "operation", op.ID, "err", err)
		}
		return http.StatusOK, PushResult{List: name, Version: v, Entries: n, Added: len(d.Add), Removed: len(d.Remove), Operation: op.ID, State: "stored"}, nil
	})
}

// blacklistOp documents a blacklist push in the OpenAPI document: its bodies, the
// Idempotency-Key and its answers.
func blacklistOp(op map[string]any, params *[]any, errResp map[string]any) {
	*params = append(*params, map[string]any{"name": "Idempotency-Key", "in": "header", "schema": map[string]any{"type": "string", "maxLength": 255},
		"description": "a push sent again with the same key (and token) is answered as the first was, and not made twice"})
	str := map[string]any{"schema": map[string]any{"type": "string"}}
	op["requestBody"] = map[string]any{"required": true, "content": map[string]any{
		"text/plain":               str,
		"application/octet-stream": map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}},
		"application/x-ndjson":     str,
	}}
	resp := op["responses"].(map[string]any)
	resp["202"] = map[string]any{"description": "a large list accepted: poll the operation it names"}
	for _, c := range []string{"409", "413", "422", "429", "507"} {
		resp[c] = errResp
	}
}
