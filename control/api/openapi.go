package api

import (
	"net/http"
	"strings"
)

// OpenAPI returns the OpenAPI 3 document of the API, generated from the route
// table the server registers, so the two cannot drift apart.
func (s *Server) OpenAPI() map[string]any {
	errResp := map[string]any{"description": "an error", "content": map[string]any{"application/json": map[string]any{
		"schema": map[string]any{"$ref": "#/components/schemas/Error"}}}}
	paths := map[string]any{}
	for _, rt := range s.routes {
		item, _ := paths[rt.Path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[rt.Path] = item
		}
		op := map[string]any{
			"summary":         rt.Summary,
			"operationId":     operationID(rt),
			"security":        []any{map[string]any{"bearer": []any{}}},
			"x-required-role": rt.Role,
			"responses": map[string]any{
				"200":     map[string]any{"description": "done"},
				"401":     errResp,
				"403":     errResp,
				"default": errResp,
			},
		}
		if rt.Kind != "" {
			op["tags"] = []any{rt.Kind}
		}
		var params []any
		for _, p := range pathParams(rt.Path) {
			typ := "string"
			if p == "revision" {
				typ = "integer"
			}
			params = append(params, map[string]any{"name": p, "in": "path", "required": true, "schema": map[string]any{"type": typ}})
		}
		for _, q := range rt.Query {
			params = append(params, map[string]any{"name": q.Name, "in": "query", "schema": map[string]any{"type": q.Type}, "description": q.Description})
		}
		switch {
		case rt.Kind == "blacklists" && rt.Method != http.MethodGet:
			blacklistOp(op, &params, errResp)
		case rt.Method == http.MethodPut:
			params = append(params,
				map[string]any{"name": "If-Match", "in": "header", "schema": map[string]any{"type": "string"}, "description": "the object's revision (its ETag); 412 conflict when it is not"},
				map[string]any{"name": "If-None-Match", "in": "header", "schema": map[string]any{"type": "string", "enum": []any{"*"}}, "description": "* to create an object that must not exist"})
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"type": "object"}}}}
			op["responses"].(map[string]any)["412"] = errResp
			op["responses"].(map[string]any)["422"] = errResp
		case rt.Method == http.MethodDelete && rt.Kind != "":
			params = append(params, map[string]any{"name": "If-Match", "in": "header", "required": true, "schema": map[string]any{"type": "string"}})
			op["responses"].(map[string]any)["412"] = errResp
			op["responses"].(map[string]any)["422"] = errResp
		case rt.Method == http.MethodPost:
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"type": "object"}}}}
		}
		if params != nil {
			op["parameters"] = params
		}
		item[strings.ToLower(rt.Method)] = op
	}
	paths["/v1/openapi.json"] = map[string]any{"get": map[string]any{
		"summary": "This document", "operationId": "getOpenAPI", "security": []any{},
		"responses": map[string]any{"200": map[string]any{"description": "the OpenAPI 3 document"}}}}
	return map[string]any{
		"openapi": "3.0.3",
		"info":    map[string]any{"title": "Tiergate controld", "version": "v1"},
		"paths":   paths,
		"components": map[string]any{
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}},
			"schemas": map[string]any{"Error": map[string]any{
				"type":     "object",
				"required": []any{"status", "code", "message"},
				"properties": map[string]any{
					"status":  map[string]any{"type": "integer"},
					"code":    map[string]any{"type": "string", "description": "stable, machine-readable: bad_request, unauthorized, forbidden, not_found, conflict, precondition_required, invalid, exists, compacted, too_large, no_space, unavailable, internal, no_route, bad_chain, key_mismatch, expired, keyserver_failed, use_upload"},
					"message": map[string]any{"type": "string"},
					"errors":  map[string]any{"type": "array", "description": "422: each refused field by its path"},
				},
			}},
		},
	}
}

// pathParams returns the names of a path's {parameters}.
func pathParams(path string) []string {
	var out []string
	for _, part := range strings.Split(path, "/") {
		if p, ok := strings.CutPrefix(part, "{"); ok {
			out = append(out, strings.TrimSuffix(p, "}"))
		}
	}
	return out
}

func operationID(rt Route) string {
	var b strings.Builder
	b.WriteString(strings.ToLower(rt.Method))
	for _, part := range strings.Split(strings.TrimPrefix(rt.Path, "/v1/"), "/") {
		if p, ok := strings.CutPrefix(part, "{"); ok {
			p = strings.TrimSuffix(p, "}")
			part = "By" + strings.ToUpper(p[:1]) + p[1:]
		}
		for _, w := range strings.Split(part, "-") {
			if w != "" {
				b.WriteString(strings.ToUpper(w[:1]) + w[1:])
			}
		}
	}
	return b.String()
}
