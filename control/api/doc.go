// Package api is controld's /v1 JSON API over the control plane's store
// (control/store) and its model (control/model).
//
// For each kind of the model (listeners, routing, pools, certificates,
// cert-bindings, l4-rules, l4-pools):
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
