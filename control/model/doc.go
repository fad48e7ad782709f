// Package model is the cluster configuration the control plane stores: listeners,
// their routing and backend pools for l7d, certificates and their bindings to
// listeners, and the L4 rules and pools for l4d; each object a JSON value in the
// store under its kind and name. It reuses the components' own models and their
// validation (l7.Listener, route.Listener and route.Pool, datapath.RuleConfig and
// datapath.PoolConfig, certs/chain.Parse) rather than writing them twice, and adds
// what only the whole cluster can check: Snapshot.Consistent finds the references
// that do not resolve (a route naming a missing pool, a binding naming a missing
// certificate or listener, a listener no certificate is bound to), so that a node is
// never sent a snapshot it must refuse.
//
// # Objects and kinds
//
//	kind           type           name                    model reused
//	listeners      Listener       the listener's name     l7.Listener
//	routing        RoutingPolicy  the listener it routes  route.Listener (vhosts, routes)
//	pools          Pool           the pool's name         route.Pool (L7 backends)
//	certificates   Certificate    the certificate's name  certs/chain.Parse; never a private key
//	cert-bindings  CertBinding    the binding's name      certificates → listeners, SNI names
//	l4-rules       L4Rule         the rule's name         datapath.RuleConfig
//	l4-pools       L4Pool         the pool's name         datapath.PoolConfig (L7 nodes)
//	l4-bgp         L4BGP          the setting's name      l4/bgp.Config (AS, peers); one a cluster
//
// Each object is its own key, so that two people editing two routes do not conflict
// and If-Match has the granularity of one object; a node's configuration is put
// together from the snapshot (Snapshot.RouteConfig, Snapshot.L4Rules). What differs
// from node to node (an LD's own addresses, an l7d's QUIC server ID) is not in the
// cluster model: it stays in the node's own file.
//
// # Field paths
//
// Every error is a *config.FieldError whose path names the object and the field, as
// "<kind>/<name>.<field>" with the field in the object's JSON form:
// "routing/web.vhosts[0].routes[1].action.pool", "cert-bindings/www.certificates[0]",
// "l4-rules/https.pool". An object's own Validate names fields within it ("addr").
package model
