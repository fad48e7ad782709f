package api

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/control/crowdsec"
	"github.com/tiergate/tiergate/internal/daemon"
)

// decisionsRoute is the push of CrowdSec's decision shape to a blacklist, for a
// risk engine that pushes rather than being pulled from (control/crowdsec).
func (b *blacklistAPI) decisionsRoute() Route {
	return Route{Method: "POST", Path: "/v1/blacklists/{name}/decisions", Kind: "blacklists",
		Summary: "Add and remove entries given as CrowdSec decisions ({value, scope: Ip|Range, type, duration, origin, scenario}): " +
			`{"new":[…],"deleted":[…]} as CrowdSec's Local API streams them, or an array of new ones; deletions first, ` +
			"a duration is the entry's expiry, other scopes and types not enforced skipped and counted; Idempotency-Key",
		Role: "admin or risk-engine", access: accessRead, h: b.decisions,
		Query: []QueryParam{{Name: "types", Type: "string", Description: "the decision types enforced, comma-separated; default ban"}}}
}

// DecisionsResult is the answer of a decisions push: the delta stored (or
// nothing, every decision skipped: State "unchanged") and the decisions skipped
// by reason (scope, type, expired).
type DecisionsResult struct {
	PushResult
	Skipped map[string]int `json:"skipped,omitempty"`
}

func (b *blacklistAPI) decisions(w http.ResponseWriter, r *http.Request, who Token) error {
	if err := canPush(r, who); err != nil {
		return err
	}
	name := r.PathValue("name")
	if err := blsync.CheckName(name); err != nil {
		return daemon.Wrap(http.StatusBadRequest, daemon.CodeBadRequest, "name", err)
	}
	var types []string
	for _, t := range strings.Split(r.URL.Query().Get("types"), ",") {
		if t = strings.TrimSpace(t); t != "" {
			types = append(types, t)
		}
	}
	return b.idempotent(w, r, who, func() (int, any, error) {
		release, err := b.up.Acquire(r.Context(), b.limits)
		if err != nil {
			return 0, nil, pushError(w, err)
		}
		defer release()
		s, err := crowdsec.DecodePush(http.MaxBytesReader(w, r.Body, b.limits.MaxBodyBytes), b.limits.MaxBodyBytes)
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return 0, nil, readError(w, err)
		case err != nil:
			return 0, nil, daemon.Wrap(http.StatusBadRequest, daemon.CodeBadRequest, "push refused; nothing changed", err)
		}
		if n := len(s.New) + len(s.Deleted); n > b.limits.MaxEntries {
			return 0, nil, daemon.Errorf(http.StatusRequestEntityTooLarge, daemon.CodeTooLarge, "push refused; nothing changed: %d decisions, over max_entries %d", n, b.limits.MaxEntries)
		}
		if err := crowdsec.Check(s); err != nil {
			return 0, nil, &daemon.APIError{Status: http.StatusUnprocessableEntity, Code: CodeInvalid, Message: "push refused; nothing changed", Err: err,
				Details: map[string]any{"errors": fieldProblems(err)}}
		}
		d, reasons, skipped := crowdsec.ToDelta(s, &crowdsec.Filter{Types: types}, time.Now())
		n := len(d.Add) + len(d.Remove)
		if n == 0 {
			var v int64
			if m, err := b.w.Show(r.Context(), name); err == nil {
				v = m.Version
			}
			return http.StatusOK, DecisionsResult{PushResult: PushResult{List: name, Version: v, State: "unchanged"}, Skipped: skipped}, nil
		}
		op := newOperation(name, "delta", who.Name, n)
		v, err := b.w.DeltaMeta(r.Context(), name, d, blsync.Meta{Who: who.Name, Reasons: reasons})
		b.audit(r, who, name, op, v, err)
		if err != nil {
			return 0, nil, storeError("storing the decisions in blacklist "+name, err)
		}
		op.Version, op.Stored = v, true
		if err := b.saveOperation(r.Context(), op); err != nil {
			b.s.log.Warn("blacklist: recording an operation", "operation", op.ID, "err", err)
		}
		return http.StatusOK, DecisionsResult{
			PushResult: PushResult{List: name, Version: v, Entries: n, Added: len(d.Add), Removed: len(d.Remove), Operation: op.ID, State: "stored"},
			Skipped:    skipped,
		}, nil
	})
}
