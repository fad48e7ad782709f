// Package api is controld's /v1 JSON API over the control plane's store
// (control/store) and its model (control/model).
//
// For each kind of the model (listeners, routing, pools, certificates,
// cert-bindings, l4-rules, l4-pools, l4-bgp):
//
//	GET    /v1/{kind}          list, at one revision
//	GET    /v1/{kind}/{name}   one object; ETag is its revision (etcd mod revision)
//	PUT    /v1/{kind}/{name}   If-None-Match: * creates, If-Match: "<rev>" replaces
//	DELETE /v1/{kind}/{name}   If-Match: "<rev>"
//
// and POST /v1/changesets commits several puts and deletes, each with the revision
// it expects, in one transaction or not at all. Every write is checked with the
// model (model.Check: each object alone, then the consistency of the whole
// snapshot it would make), so a refused field is answered 422 "invalid" with each
// problem by its path ("routing/web.vhosts[0].routes[0].action.pool"), a revision
// that is not the object's 412 "conflict", and a write without a precondition 428.
// Errors have the daemon kit's one shape (daemon.APIError) with stable codes.
//
// Certificates are only written by an upload (certs.go), which checks the chain
// and its key (control/certupload), imports the key into every keyserver and
// verifies a signature from each before the chain is stored; the PUT of one, or a
// change set's, is refused 405 "use_upload":
//
//	POST /v1/certificates/{name}/versions  {"chain","key","dry_run"}: 201 a new version
//	GET  /v1/certificates/{name}/versions  every version, kept under model.CertVersionPrefix
//	POST /v1/certificates/{name}/rollback  {"version"} with If-Match: that version in force
//
// A refused upload is 422 "bad_chain", "key_mismatch", "expired" or "invalid"
// naming its field ("chain[1]", "key"), a keyserver that failed 502
// "keyserver_failed" naming it; nothing is stored then.
//
// The configuration's history and the nodes:
//
//	GET  /v1/revisions?limit=N       the writes, newest first: {"revisions":[{"revision",
//	                                 "time","who","changes":[{"op","kind","name"}]}]}
//	GET  /v1/revisions/{revision}    one of them
//	GET  /v1/diff?from=R1&to=R2      {"from","to","changes":[{"op","kind","name","before",
//	                                 "after"}]}; to defaults to now
//	POST /v1/changesets?dry_run=true checks a change set and answers {"dry_run","revision",
//	                                 "changes"} as a diff, storing nothing
//	POST /v1/rollback                {"revision":R,"expect_revision":E,"dry_run":false}:
//	                                 one change set making the objects those at R; 412 when
//	                                 the configuration was written after E, 410 "compacted"
//	                                 when R is; the role must write every kind it changes
//	GET  /v1/rollouts/{revision}     each node applied, refused (with its error), pending or
//	                                 lost, and the counts
//	GET  /v1/nodes                   each node's role, address, applied revision, lag (the
//	                                 configuration's revision minus the applied one), state
//	                                 (ok, refused, lost), start, uptime and certificates
//	DELETE /v1/nodes/{name}          admin: forget a lost node (its seen record); 409
//	                                 "exists" while it reports
//
// Blacklists (blacklists.go, stored by control/blsync outside the objects'
// prefix), written by admin or risk-engine, read by any token:
//
//	PUT  /v1/blacklists/{name}        a whole list: text, binary, gzip, or NDJSON
//	                                  (application/x-ndjson); over AsyncEntries
//	                                  entries 202 with an operation, else 200 stored
//	POST /v1/blacklists/{name}/delta  NDJSON lines {ip|cidr, expires|duration,
//	                                  reason, op} or text delta lines (+/-)
//	POST /v1/blacklists/{name}/decisions  CrowdSec's decisions (decisions.go,
//	                                  control/crowdsec): {"new":[…],"deleted":[…]} as
//	                                  its Local API streams them, or an array of new
//	                                  ones; deletions first, a duration the expiry,
//	                                  ban only unless ?types=, other scopes skipped
//	GET  /v1/blacklists[/{name}]      version, size, and each node's version and
//	                                  hits of the list, and their total
//	GET  /v1/operations/{id}          pending, applied on N of M nodes, failed: why
//
// Bad lines are refused 422 "bad_lines", each by its number, and nothing changes;
// an Idempotency-Key makes a retried push answer as the first did.
//
// Who and what of each write are recorded by the store in the head key of the
// write's own transaction (control/store), the token's name as who. Nodes report
// under a lease and leave a seen record (control/agent): a node with a seen
// record and no status is lost.
//
// Every route but /v1/openapi.json takes "Authorization: Bearer <token>". Tokens
// ("<name>.<64 hex digits>") have a role: admin (everything, tokens included),
// policy-operator (listeners, routing, pools, L4), cert-operator (certificates and
// bindings), risk-engine and viewer (read). Only the SHA-256 of a token's 32 random
// bytes is stored, under TokenPrefix, outside the objects nodes read; it is
// compared in constant time. Every write is audit-logged: the token's name, the
// method, kind, name and the revision.
//
// The OpenAPI 3 document at /v1/openapi.json is generated from the same route
// table the server registers.
package api
