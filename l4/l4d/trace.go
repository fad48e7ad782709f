package l4d

import (
	"net/http"

	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/l4/trace"
)

// traceRoutes adds GET /trace: the trace and drop points the workers recorded for
// marked probe packets (the trace section), newest first, as datapath.TraceReport.
// The query filters them: src (an address or prefix: the probe's side, the source of
// a packet in, the destination of a reply out), kind (trace or drop), reason (a drop
// reason: no_rule, blacklisted, ...) and limit (default 100). A bad query is 400
// bad_request.
func (d *Daemon) traceRoutes(handle func(string, daemon.Handler)) {
	handle("GET /trace", func(w http.ResponseWriter, r *http.Request) error {
		f, err := trace.ParseQuery(r.URL.Query())
		if err != nil {
			return badRequest("%v", err)
		}
		daemon.WriteJSON(w, http.StatusOK, d.dist.Trace(f))
		return nil
	})
}
