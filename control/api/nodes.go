package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/daemon"
)

// States of a node in GET /v1/nodes.
const (
	NodeOK      = "ok"      // reporting, the configuration it last tried applied
	NodeRefused = "refused" // reporting a NACK of the latest configuration it tried
	NodeLost    = "lost"    // a seen record and no status: its lease ran out
)

// States of a node in a rollout.
const (
	RolloutApplied = "applied" // the node applied the revision or a later one
	RolloutRefused = "refused" // the node refused it (or a later one) and has not applied it
	RolloutPending = "pending" // the node reports, and has neither applied nor refused it yet
	RolloutLost    = "lost"    // the node no longer reports
)

// nodeRoutes are the routes of the nodes and of the rollout of a revision to them.
func (s *Server) nodeRoutes() []Route {
	return []Route{
		{Method: "GET", Path: "/v1/nodes", Summary: "Every node: role, address, applied revision and lag, state (ok, refused, lost), uptime and the certificates it serves", Role: "any", access: accessRead, h: s.nodes},
		{Method: "DELETE", Path: "/v1/nodes/{name}", Summary: "Forget a lost node (its seen record); 409 exists while it reports", Role: "admin", access: accessAdmin, h: s.forgetNode},
		{Method: "GET", Path: "/v1/rollouts/{revision}", Summary: "Which nodes applied a revision, refused it (and why), have not answered yet, or are lost", Role: "any", access: accessRead, h: s.rollout},
	}
}

// Node is a node in the answer of GET /v1/nodes.
type Node struct {
	Node            string `json:"node"`
	Role            string `json:"role"`
	Address         string `json:"address"`
	AppliedRevision int64  `json:"applied_revision"`
	// Lag is the configuration's revision minus AppliedRevision: 0 when nothing
	// changed since the node applied.
	Lag   int64  `json:"lag"`
	State string `json:"state"`
	// RefusedRevision and Error are the NACK of a refused node.
	RefusedRevision int64     `json:"refused_revision,omitempty"`
	Error           string    `json:"error,omitempty"`
	Started         time.Time `json:"started"`
	// UptimeSeconds is the time since Started; 0 for a lost node.
	UptimeSeconds int64 `json:"uptime_seconds"`
	// Updated is when the node's status last changed.
	Updated      time.Time         `json:"updated"`
	Certificates []agent.CertInUse `json:"certificates"`
}

// Nodes is the answer of GET /v1/nodes.
type Nodes struct {
	// Revision is the configuration's revision (the last write's) the lags are
	// counted from.
	Revision int64  `json:"revision"`
	Nodes    []Node `json:"nodes"`
}

// nodeState is a node as the store knows it: its status (when it reports) or its
// seen record.
type nodeState struct {
	st   agent.Status
	live bool // a status under a lease: the node reports
}

// readNodes returns every node known (a status or a seen record), sorted by name,
// and the configuration's revision, read at one store revision.
func (s *Server) readNodes(ctx context.Context) ([]nodeState, int64, error) {
	resp, err := s.st.Client().Txn(ctx).Then(
		clientv3.OpGet(agent.StatusPrefix, clientv3.WithPrefix()),
		clientv3.OpGet(agent.SeenPrefix, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("reading the nodes: %w", err)
	}
	head, err := s.st.Head(ctx)
	if err != nil {
		return nil, 0, err
	}
	byName := map[string]*nodeState{}
	for i, prefix := range []string{agent.StatusPrefix, agent.SeenPrefix} {
		for _, kv := range resp.Responses[i].GetResponseRange().GetKvs() {
			name := strings.TrimPrefix(string(kv.Key), prefix)
			if byName[name] != nil {
				continue // the status, read first, is the newer
			}
			var st agent.Status
			if err := json.Unmarshal(kv.Value, &st); err != nil {
				s.log.Warn("a node's status is not JSON", "key", string(kv.Key), "err", err)
				continue
			}
			st.Node = name
			byName[name] = &nodeState{st: st, live: i == 0}
		}
	}
	out := make([]nodeState, 0, len(byName))
	for _, n := range byName {
		out = append(out, *n)
	}
	slices.SortFunc(out, func(a, b nodeState) int { return strings.Compare(a.st.Node, b.st.Node) })
	return out, head, nil
}

func (s *Server) nodes(w http.ResponseWriter, r *http.Request, _ Token) error {
	ns, head, err := s.readNodes(r.Context())
	if err != nil {
		return storeError("reading the nodes", err)
	}
	now := time.Now()
	out := Nodes{Revision: head, Nodes: make([]Node, 0, len(ns))}
	for _, n := range ns {
		st := n.st
		node := Node{
			Node: st.Node, Role: st.Role, Address: st.Address, AppliedRevision: st.AppliedRevision,
			Lag: max(0, head-st.AppliedRevision), State: NodeOK, RefusedRevision: st.RefusedRevision, Error: st.Error,
			Started: st.Started, Updated: st.Updated, Certificates: st.Certificates,
		}
		switch {
		case !n.live:
			node.State = NodeLost
		case st.Error != "":
			node.State = NodeRefused
		}
		if n.live && !st.Started.IsZero() {
			node.UptimeSeconds = int64(now.Sub(st.Started).Seconds())
		}
		if node.Certificates == nil {
			node.Certificates = []agent.CertInUse{}
		}
		out.Nodes = append(out.Nodes, node)
	}
	daemon.WriteJSON(w, http.StatusOK, out)
	return nil
}

// RolloutNode is a node in the answer of GET /v1/rollouts/{revision}.
type RolloutNode struct {
	Node            string `json:"node"`
	Role            string `json:"role"`
	State           string `json:"state"`
	AppliedRevision int64  `json:"applied_revision"`
	RefusedRevision int64  `json:"refused_revision,omitempty"`
	Error           string `json:"error,omitempty"`
}

// Rollout is the answer of GET /v1/rollouts/{revision}: each node's state for the
// revision, and how many are in each.
type Rollout struct {
	Revision int64         `json:"revision"`
	Nodes    []RolloutNode `json:"nodes"`
	Applied  int           `json:"applied"`
	Refused  int           `json:"refused"`
	Pending  int           `json:"pending"`
	Lost     int           `json:"lost"`
}

func (s *Server) rollout(w http.ResponseWriter, r *http.Request, _ Token) error {
	rev, err := pathRevision(r)
	if err != nil {
		return err
	}
	ns, head, err := s.readNodes(r.Context())
	if err != nil {
		return storeError("reading the nodes", err)
	}
	if rev > head {
		return daemon.Errorf(http.StatusNotFound, daemon.CodeNotFound, "revision %d: the configuration is at %d", rev, head)
	}
	out := Rollout{Revision: rev, Nodes: make([]RolloutNode, 0, len(ns))}
	for _, n := range ns {
		st := n.st
		rn := RolloutNode{Node: st.Node, Role: st.Role, AppliedRevision: st.AppliedRevision}
		switch {
		case !n.live:
			rn.State = RolloutLost
			out.Lost++
		case st.AppliedRevision >= rev:
			rn.State = RolloutApplied
			out.Applied++
		case st.Error != "" && st.RefusedRevision >= rev:
			rn.State = RolloutRefused
			rn.RefusedRevision, rn.Error = st.RefusedRevision, st.Error
			out.Refused++
		default:
			rn.State = RolloutPending
			out.Pending++
		}
		out.Nodes = append(out.Nodes, rn)
	}
	daemon.WriteJSON(w, http.StatusOK, out)
	return nil
}

// forgetNode deletes a node's seen record, unless the node reports: a node taken
// out of the cluster is then no longer listed as lost.
func (s *Server) forgetNode(w http.ResponseWriter, r *http.Request, who Token) error {
	name := r.PathValue("name")
	if err := store.CheckName(name); err != nil {
		return daemon.Wrap(http.StatusNotFound, daemon.CodeNotFound, "node "+name, err)
	}
	cli := s.st.Client()
	// Deleted only while there is no status: a node that reports is not forgotten.
	resp, err := cli.Txn(r.Context()).
		If(clientv3.Compare(clientv3.CreateRevision(agent.StatusKey(name)), "=", 0)).
		Then(clientv3.OpDelete(agent.SeenKey(name))).
		Commit()
	if err != nil {
		return storeError("forgetting node "+name, err)
	}
	if !resp.Succeeded {
		return daemon.Errorf(http.StatusConflict, CodeExists, "node %s reports: only a lost node is forgotten", name)
	}
	if resp.Responses[0].GetResponseDeleteRange().GetDeleted() == 0 {
		return daemon.Errorf(http.StatusNotFound, daemon.CodeNotFound, "no node %q", name)
	}
	s.log.Info("audit: node forgotten", "token", who.Name, "method", r.Method, "kind", "nodes", "name", name)
	w.WriteHeader(http.StatusNoContent)
	return nil
}
