package api

import (
	"bytes"
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"

	certchain "github.com/tiergate/tiergate/certs/chain"
	"github.com/tiergate/tiergate/control/certupload"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// Error codes of certificate uploads (certupload's), and of a certificate written
// any other way.
const (
	CodeBadChain        = certupload.CodeBadChain        // 422: the chain is refused (its field named)
	CodeKeyMismatch     = certupload.CodeKeyMismatch     // 422: the key is not the leaf's
	CodeExpired         = certupload.CodeExpired         // 422: a certificate is expired or not yet valid
	CodeKeyserverFailed = certupload.CodeKeyserverFailed // 502: a keyserver failed (named); 503: none configured
	CodeUseUpload       = "use_upload"                   // 405: certificates are only written by an upload
)

// uploadTimeout bounds the keyservers' part of an upload or a rollback.
const uploadTimeout = 30 * time.Second

// maxUploadBytes bounds an upload's body: a chain and a key.
const maxUploadBytes = store.MaxValueBytes

// certState is what the certificate routes keep besides the Server's.
type certState struct {
	keyservers atomic.Pointer[certupload.Keyservers]
	// now is the clock of the validity checks; time.Now when nil (tests set it).
	now func() time.Time
}

// SetKeyservers gives the server the keyservers a certificate's key is imported
// into (every one of the cluster); nil takes them away. Until then uploads are
// refused (keyserver_failed). The server does not close them.
func (s *Server) SetKeyservers(k *certupload.Keyservers) { s.certs.keyservers.Store(k) }

func (s *Server) now() time.Time {
	if s.certs.now != nil {
		return s.certs.now()
	}
	return time.Now()
}

// certRoutes returns routes with the certificates' own: uploads of versions, their
// list and the rollback to one; the list of certificates with days_left. A
// certificate is only stored once its key is in every keyserver, so the generic PUT
// of one is refused (405 use_upload, not a route of the document), as is a change
// set that puts one.
func (s *Server) certRoutes(routes []Route) []Route {
	const kind = model.KindCertificate
	out := make([]Route, 0, len(routes)+3)
	for _, rt := range routes {
		switch {
		case rt.Kind == kind && rt.Method == http.MethodPut:
			refused := rt
			refused.h = s.refuseCertificatePut
			s.mux.Handle(rt.Method+" "+rt.Path, s.guard(refused))
			continue
		case rt.Kind == kind && rt.Method == http.MethodGet && !strings.Contains(rt.Path, "{"):
			rt.h = s.listCertificates
			rt.Summary += ", with their names, key types, key IDs, not-after and days left"
		case rt.Path == "/v1/changesets" && rt.Method == http.MethodPost:
			rt.h = s.noCertificatePuts(rt.h)
		}
		out = append(out, rt)
	}
	wr := "admin or " + string(writers[kind])
	return append(out,
		Route{Method: "POST", Path: "/v1/certificates/{name}/versions", Kind: kind, Summary: "Upload a new version of a certificate: a PEM chain and its key, imported into every keyserver and verified before the chain is stored (dry_run: checks only)", Role: wr, access: accessWrite, h: s.uploadCertificate},
		Route{Method: "GET", Path: "/v1/certificates/{name}/versions", Kind: kind, Summary: "List every stored version of a certificate", Role: "any", access: accessRead, h: s.listCertificateVersions},
		Route{Method: "POST", Path: "/v1/certificates/{name}/rollback", Kind: kind, Summary: "Make a stored version the certificate in force (If-Match: the certificate's revision)", Role: wr, access: accessWrite, h: s.rollbackCertificate},
	)
}

func (s *Server) refuseCertificatePut(w http.ResponseWriter, r *http.Request, _ Token) error {
	w.Header().Set("Allow", "GET, DELETE")
	return daemon.Errorf(http.StatusMethodNotAllowed, CodeUseUpload,
		"a certificate is written by POST /v1/certificates/%s/versions with its chain and key, which are imported into the keyservers and verified first", r.PathValue("name"))
}

// noCertificatePuts refuses a change set that puts a certificate, before next.
func (s *Server) noCertificatePuts(next func(http.ResponseWriter, *http.Request, Token) error) func(http.ResponseWriter, *http.Request, Token) error {
	return func(w http.ResponseWriter, r *http.Request, who Token) error {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, store.MaxChangeSetBytes+64<<10))
		if err != nil {
			return daemon.AsAPIError(err)
		}
		var req struct {
			Changes []struct {
				Kind   string `json:"kind"`
				Delete bool   `json:"delete"`
			} `json:"changes"`
		}
		if json.Unmarshal(body, &req) == nil {
			for i, c := range req.Changes {
				if c.Kind == model.KindCertificate && !c.Delete {
					return daemon.Errorf(http.StatusMethodNotAllowed, CodeUseUpload,
						"%s: a certificate is written by POST /v1/certificates/{name}/versions with its chain and key, not in a change set", config.Index("changes", i))
				}
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		return next(w, r, who)
	}
}

// CertItem is a certificate in the answer of GET /v1/certificates: the list's
// item, and the certificate's summary.
type CertItem struct {
	Item
	Version  int       `json:"version"`
	SANs     []string  `json:"sans"`
	KeyType  string    `json:"key_type"`
	KeyID    string    `json:"key_id"`
	NotAfter time.Time `json:"not_after"`
	// DaysLeft is the whole days until NotAfter, negative once it has passed.
	DaysLeft int `json:"days_left"`
}

// CertList is the answer of GET /v1/certificates.
type CertList struct {
	Revision int64      `json:"revision"`
	Items    []CertItem `json:"items"`
}

func (s *Server) listCertificates(w http.ResponseWriter, r *http.Request, _ Token) error {
	objs, rev, err := s.st.List(r.Context(), model.KindCertificate)
	if err != nil {
		return storeError("listing certificates", err)
	}
	now := s.now()
	out := CertList{Revision: rev, Items: make([]CertItem, 0, len(objs))}
	for _, o := range objs {
		it := CertItem{Item: Item{Name: o.Name, Revision: o.ModRevision, Object: o.Value}}
		var c model.Certificate
		if json.Unmarshal(o.Value, &c) == nil {
			it.Version, it.SANs, it.KeyType, it.KeyID, it.NotAfter = c.Version, c.SANs, c.KeyType, c.KeyID, c.NotAfter
			it.DaysLeft = c.DaysLeft(now)
		}
		out.Items = append(out.Items, it)
	}
	daemon.WriteJSON(w, http.StatusOK, out)
	return nil
}

// UploadRequest is the body of POST /v1/certificates/{name}/versions.
type UploadRequest struct {
	// Chain is the PEM certificate chain, the leaf first (another order is put
	// right and the answer says so).
	Chain string `json:"chain"`
	// Key is the leaf's PEM private key (PKCS #8, PKCS #1 or SEC 1). It is only
	// sent to the keyservers: never stored, logged or written to a file.
	Key secretPEM `json:"key"`
	// DryRun checks the chain and the key and that every keyserver answers, and
	// stores and imports nothing. Also ?dry_run=true.
	DryRun bool `json:"dry_run,omitempty"`
}

// UploadResult is the answer of an upload (201) or a dry run (200), and of a
// rollback (200).
type UploadResult struct {
	// Certificate is the version stored (would be, in a dry run).
	Certificate *model.Certificate `json:"certificate"`
	// Revision is the store's revision of the write; in a dry run, the
	// certificate's current revision (0: none).
	Revision int64 `json:"revision"`
	// Reordered says the chain was given in another order and stored leaf first.
	Reordered bool `json:"reordered"`
	// Notes say what the check changed or noticed.
	Notes []string `json:"notes"`
	// Keyservers is what each keyserver did.
	Keyservers []certupload.Result `json:"keyservers"`
	// DryRun says nothing was stored or imported.
	DryRun bool `json:"dry_run,omitempty"`
}

func (s *Server) uploadCertificate(w http.ResponseWriter, r *http.Request, who Token) error {
	name := r.PathValue("name")
	if err := store.CheckName(name); err != nil {
		return daemon.Wrap(http.StatusBadRequest, daemon.CodeBadRequest, "name", err)
	}
	ifRev := int64(-1)
	if r.Header.Get("If-Match") != "" || r.Header.Get("If-None-Match") != "" {
		rev, err := precondition(r, true)
		if err != nil {
			return err
		}
		ifRev = rev
	}
	var req UploadRequest
	err := decodeSecret(w, r, maxUploadBytes, &req)
	defer func() { clear(req.Key) }()
	if err != nil {
		return err
	}
	if v := r.URL.Query().Get("dry_run"); v != "" {
		dry, perr := strconv.ParseBool(v)
		if perr != nil {
			return daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "dry_run %q: want true or false", v)
		}
		req.DryRun = req.DryRun || dry
	}
	ck, err := certupload.Check([]byte(req.Chain), req.Key, s.now())
	clear(req.Key)
	if err != nil {
		return uploadError(err)
	}
	defer ck.Wipe()

	cur, version, err := s.certVersions(r.Context(), name)
	if err != nil {
		return err
	}
	if ifRev < 0 {
		ifRev = cur
	}
	c, err := model.NewCertificate(name, version+1, ck.PEM)
	if err != nil {
		return &daemon.APIError{Status: http.StatusUnprocessableEntity, Code: CodeInvalid, Message: "the certificate is refused", Err: err,
			Details: map[string]any{"errors": fieldProblems(err)}}
	}
	res := UploadResult{Certificate: c, Revision: cur, Reordered: ck.Reordered, Notes: append([]string{}, ck.Notes...), DryRun: req.DryRun}
	ctx, cancel := context.WithTimeout(r.Context(), uploadTimeout)
	defer cancel()
	// What the commit's check will say, before a key goes to any keyserver.
	if err := s.checkWith(r.Context(), c, ifRev); err != nil {
		return err
	}
	ks := s.certs.keyservers.Load()
	if req.DryRun {
		res.Keyservers, err = ks.Ping(ctx)
		if err != nil {
			return keyserverError(err, res.Keyservers)
		}
		daemon.WriteJSON(w, http.StatusOK, res)
		return nil
	}
	label := fmt.Sprintf("%s.v%d", name, c.Version)
	res.Keyservers, err = ks.Import(ctx, ck, label)
	ck.Wipe()
	if err != nil {
		s.log.Info("audit: certificate upload refused", "token", who.Name, "role", who.Role, "name", name, "version", c.Version, "key_id", c.KeyID, "err", err)
		return keyserverError(err, res.Keyservers)
	}
	rec := model.CertificateVersion{Certificate: *c, Uploaded: s.now().UTC(), UploadedBy: who.Name, Keyservers: ks.Addrs()}
	recJSON, err := json.Marshal(rec)
	if err != nil {
		return daemon.Wrap(http.StatusInternalServerError, daemon.CodeInternal, "encoding the version", err)
	}
	value, err := json.Marshal(c)
	if err != nil {
		return daemon.Wrap(http.StatusInternalServerError, daemon.CodeInternal, "encoding the certificate", err)
	}
	rev, err := s.commitSet(r, who, store.ChangeSet{
		Changes: []store.Change{{Kind: model.KindCertificate, Name: name, Value: value, IfRevision: ifRev}},
		Extra:   []store.ExtraPut{{Key: model.CertVersionKey(name, c.Version), Value: recJSON}},
	})
	if err != nil {
		return storeError("storing the certificate", err)
	}
	s.log.Info("audit: certificate version uploaded", "token", who.Name, "name", name, "version", c.Version, "key_id", c.KeyID, "keyservers", ks.Addrs(), "revision", rev)
	res.Revision = rev
	w.Header().Set("ETag", etag(rev))
	daemon.WriteJSON(w, http.StatusCreated, res)
	return nil
}

// certVersions reads, at one revision, the certificate name's revision (0: none)
// and the highest version it has had.
func (s *Server) certVersions(ctx context.Context, name string) (rev int64, version int, err error) {
	resp, err := s.st.Client().Txn(ctx).Then(
		clientv3.OpGet(store.Key(model.KindCertificate, name)),
		clientv3.OpGet(versionsPrefix(name), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return 0, 0, daemon.Wrap(http.StatusServiceUnavailable, daemon.CodeUnavailable, "reading the certificate's versions", err)
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		rev = kvs[0].ModRevision
		var c model.Certificate
		if json.Unmarshal(kvs[0].Value, &c) == nil {
			version = c.Version
		}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		_, v, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), model.CertVersionPrefix), "/")
		if n, err := strconv.Atoi(v); err == nil && n > version {
			version = n
		}
	}
	return rev, version, nil
}

// versionsPrefix is the etcd prefix of the versions of the certificate name.
func versionsPrefix(name string) string { return model.CertVersionPrefix + name + "/" }

// remoteKey is a stored certificate's key at the keyservers.
type remoteKey struct {
	id  protocol.KeyID
	pub crypto.PublicKey
}

// leafOf returns the key of c's leaf.
func leafOf(c *model.Certificate) (remoteKey, error) {
	chain, err := certchain.Parse([]byte(c.Chain))
	if err != nil {
		return remoteKey{}, err
	}
	return remoteKey{id: protocol.KeyIDFromSPKI(chain[0].RawSubjectPublicKeyInfo), pub: chain[0].PublicKey}, nil
}

// checkWith answers what the store's check says of the configuration with c in
// place of its certificate at revision ifRev, without writing.
func (s *Server) checkWith(ctx context.Context, c *model.Certificate, ifRev int64) error {
	value, err := json.Marshal(c)
	if err != nil {
		return daemon.Wrap(http.StatusInternalServerError, daemon.CodeInternal, "encoding the certificate", err)
	}
	_, err = s.st.DryRun(ctx, store.ChangeSet{
		Changes: []store.Change{{Kind: model.KindCertificate, Name: c.Name, Value: value, IfRevision: ifRev}},
		Check:   model.Check,
	})
	if err != nil {
		return storeError("checking the certificate", err)
	}
	return nil
}

// VersionItem is one version in the answer of GET /v1/certificates/{name}/versions.
type VersionItem struct {
	model.CertificateVersion
	// DaysLeft is the whole days until NotAfter, negative once it has passed.
	DaysLeft int `json:"days_left"`
	// Current says it is the certificate in force.
	Current bool `json:"current"`
}

// VersionList is the answer of GET /v1/certificates/{name}/versions.
type VersionList struct {
	Name string `json:"name"`
	// Current is the version in force, 0 when the certificate is not stored.
	Current int `json:"current"`
	// Revision is the certificate's revision (its ETag, for a rollback's
	// If-Match), 0 when it is not stored.
	Revision int64 `json:"revision"`
	// Versions are every version stored, oldest first.
	Versions []VersionItem `json:"versions"`
}

func (s *Server) listCertificateVersions(w http.ResponseWriter, r *http.Request, _ Token) error {
	name := r.PathValue("name")
	if err := store.CheckName(name); err != nil {
		return daemon.Wrap(http.StatusNotFound, daemon.CodeNotFound, "certificates/"+name, err)
	}
	prefix := versionsPrefix(name)
	resp, err := s.st.Client().Txn(r.Context()).Then(
		clientv3.OpGet(store.Key(model.KindCertificate, name)),
		clientv3.OpGet(prefix, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return daemon.Wrap(http.StatusServiceUnavailable, daemon.CodeUnavailable, "reading the certificate's versions", err)
	}
	out := VersionList{Name: name, Versions: []VersionItem{}}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		out.Revision = kvs[0].ModRevision
		var c model.Certificate
		if json.Unmarshal(kvs[0].Value, &c) == nil {
			out.Current = c.Version
		}
	}
	now := s.now()
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		var it VersionItem
		if err := json.Unmarshal(kv.Value, &it.CertificateVersion); err != nil {
			return daemon.Wrap(http.StatusInternalServerError, daemon.CodeInternal, "reading "+string(kv.Key), err)
		}
		it.DaysLeft = it.Certificate.DaysLeft(now)
		it.Current = it.Version == out.Current
		out.Versions = append(out.Versions, it)
	}
	slices.SortFunc(out.Versions, func(a, b VersionItem) int { return a.Version - b.Version })
	if len(out.Versions) == 0 && out.Revision == 0 {
		return daemon.Errorf(http.StatusNotFound, daemon.CodeNotFound, "no certificate %q and no version of it", name)
	}
	if out.Revision > 0 {
		w.Header().Set("ETag", etag(out.Revision))
	}
	daemon.WriteJSON(w, http.StatusOK, out)
	return nil
}

// CertRollbackRequest is the body of POST /v1/certificates/{name}/rollback.
type CertRollbackRequest struct {
	// Version is the stored version to put in force.
	Version int `json:"version"`
}

func (s *Server) rollbackCertificate(w http.ResponseWriter, r *http.Request, who Token) error {
	name := r.PathValue("name")
	if err := store.CheckName(name); err != nil {
		return daemon.Wrap(http.StatusNotFound, daemon.CodeNotFound, "certificates/"+name, err)
	}
	ifRev, err := precondition(r, true)
	if err != nil {
		return err
	}
	var req CertRollbackRequest
	if err := daemon.DecodeRequest(w, r, 4<<10, &req); err != nil {
		return err
	}
	if req.Version < 1 {
		return daemon.Errorf(http.StatusUnprocessableEntity, CodeInvalid, "version: %d: versions count from 1", req.Version)
	}
	resp, err := s.st.Client().Get(r.Context(), model.CertVersionKey(name, req.Version))
	if err != nil {
		return daemon.Wrap(http.StatusServiceUnavailable, daemon.CodeUnavailable, "reading the version", err)
	}
	if len(resp.Kvs) == 0 {
		return daemon.Errorf(http.StatusNotFound, daemon.CodeNotFound, "certificate %q has no version %d", name, req.Version)
	}
	var rec model.CertificateVersion
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return daemon.Wrap(http.StatusInternalServerError, daemon.CodeInternal, "reading the version", err)
	}
	c := &rec.Certificate
	ck, err := model.NewCertificate(name, c.Version, []byte(c.Chain))
	if err != nil {
		return daemon.Wrap(http.StatusInternalServerError, daemon.CodeInternal, "the stored version", err)
	}
	if now := s.now(); now.After(ck.NotAfter) {
		return &daemon.APIError{Status: http.StatusUnprocessableEntity, Code: CodeExpired,
			Message: fmt.Sprintf("version: version %d expired at %s", req.Version, ck.NotAfter.Format(time.RFC3339)),
			Details: map[string]any{"field": "version", "errors": []FieldProblem{{Path: "version", Message: "expired"}}}}
	}
	// The key must still be in every keyserver.
	leaf, perr := leafOf(ck)
	if perr != nil {
		return daemon.Wrap(http.StatusInternalServerError, daemon.CodeInternal, "the stored version", perr)
	}
	ctx, cancel := context.WithTimeout(r.Context(), uploadTimeout)
	defer cancel()
	results, err := s.certs.keyservers.Load().Verify(ctx, leaf.id, leaf.pub)
	if err != nil {
		return keyserverError(err, results)
	}
	value, err := json.Marshal(ck)
	if err != nil {
		return daemon.Wrap(http.StatusInternalServerError, daemon.CodeInternal, "encoding the certificate", err)
	}
	rev, err := s.commitSet(r, who, store.ChangeSet{
		Changes: []store.Change{{Kind: model.KindCertificate, Name: name, Value: value, IfRevision: ifRev}},
	})
	if err != nil {
		return storeError("rolling the certificate back", err)
	}
	s.log.Info("audit: certificate rolled back", "token", who.Name, "name", name, "version", req.Version, "key_id", ck.KeyID, "revision", rev)
	w.Header().Set("ETag", etag(rev))
	daemon.WriteJSON(w, http.StatusOK, UploadResult{Certificate: ck, Revision: rev, Notes: []string{}, Keyservers: results})
	return nil
}

// uploadError maps certupload's refusals to the API's errors: 422 with the field.
func uploadError(err error) error {
	var e *certupload.Error
	if !errors.As(err, &e) {
		return daemon.Wrap(http.StatusInternalServerError, daemon.CodeInternal, "checking the upload", err)
	}
	return &daemon.APIError{Status: http.StatusUnprocessableEntity, Code: e.Code, Err: err,
		Details: map[string]any{"field": e.Field, "errors": []FieldProblem{{Path: e.Field, Message: e.Err.Error()}}}}
}

// keyserverError maps a keyserver's failure: 502 naming it, 503 when there are
// none.
func keyserverError(err error, results []certupload.Result) error {
	var e *certupload.Error
	if !errors.As(err, &e) {
		return daemon.Wrap(http.StatusInternalServerError, daemon.CodeInternal, "at the keyservers", err)
	}
	status := http.StatusBadGateway
	if e.Keyserver == "" {
		status = http.StatusServiceUnavailable
	}
	return &daemon.APIError{Status: status, Code: e.Code, Message: "nothing was stored", Err: err,
		Details: map[string]any{"keyserver": e.Keyserver, "keyservers": results}}
}

// decodeSecret reads r's JSON body, at most limit bytes, into v refusing unknown
// fields, then zeroes what it read: the body holds a private key.
func decodeSecret(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	rd := http.MaxBytesReader(w, r.Body, limit)
	buf := make([]byte, 0, min(limit, max(r.ContentLength, 16<<10)))
	defer func() { clear(buf[:cap(buf)]) }()
	for {
		if len(buf) == cap(buf) {
			bigger := make([]byte, len(buf), 2*cap(buf)+1)
			copy(bigger, buf)
			clear(buf[:cap(buf)])
			buf = bigger
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return daemon.AsAPIError(err)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return daemon.Wrap(http.StatusBadRequest, daemon.CodeBadRequest, "decoding the request body", err)
	}
	if dec.More() {
		return daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "decoding the request body: data after the JSON value")
	}
	return nil
}

// secretPEM is a JSON string decoded into bytes the caller can zero (a string could
// not be).
type secretPEM []byte

// UnmarshalJSON decodes a JSON string (or null) without making a string of it.
func (p *secretPEM) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	if len(data) < 2 || data[0] != '"' || data[len(data)-1] != '"' {
		return errors.New("key: want a JSON string holding the PEM key")
	}
	in := data[1 : len(data)-1]
	out := make([]byte, 0, len(in))
	for i := 0; i < len(in); i++ {
		c := in[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		if i+1 >= len(in) {
			clear(out)
			return errors.New("key: a bad escape in the JSON string")
		}
		i++
		switch in[i] {
		case '"', '\\', '/':
			out = append(out, in[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, n := hex4(in[i+1:])
			if n == 0 {
				clear(out)
				return errors.New("key: a bad \\u escape in the JSON string")
			}
			i += n
			if utf16.IsSurrogate(r) {
				if i+2 < len(in) && in[i+1] == '\\' && in[i+2] == 'u' {
					if r2, n2 := hex4(in[i+3:]); n2 > 0 {
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							r = dec
							i += 2 + n2
						}
					}
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			clear(out)
			return errors.New("key: a bad escape in the JSON string")
		}
	}
	*p = out
	return nil
}

// hex4 reads 4 hex digits at the start of b: the rune and 4, or 0 when they are not.
func hex4(b []byte) (rune, int) {
	if len(b) < 4 {
		return 0, 0
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, 0
		}
	}
	return r, 4
}
