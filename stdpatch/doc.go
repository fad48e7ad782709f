// Package stdpatch holds the tests of the patches Tiergate's build applies to the Go
// standard library, and documents them. The patched files are in _go1.N/ (a copy of
// each standard library file with the change, the SHA-256 of the file it was made
// from in .base.sha256, and in GOVERSION the Go release it was made from);
// overlay.sh turns them into a `go build -overlay` file, which the Makefile passes to
// every go command, with the build tag tiergate_stdpatch, when the Go in use has the
// files the patches were made from. Built any other way, Tiergate uses the standard
// library as it is.
//
// The patch must not go missing unnoticed: on the Go release named in GOVERSION,
// overlay.sh fails (exit status 3) when a file is not the one the patch was made from,
// and `make test` then fails (its stdpatch-check step) instead of testing the
// standard library as it is; a build without the tag on that release fails
// TestPatchApplied under TIERGATE_REQUIRE_ALL=1 as well. On other releases of go1.N
// whose file changed, the build goes on without the patch and says so. To see the
// failure: STDPATCH_GOROOT=DIR make stdpatch-check, with DIR a Go tree whose
// src/crypto/ecdh/x25519.go differs.
//
// The patches:
//
//   - crypto/ecdh: X25519 public keys (the server's key share in every TLS 1.3, TLS
//     1.2 ECDHE and QUIC handshake) are computed with edwards25519's precomputed base
//     point table instead of the Montgomery ladder, as BoringSSL and OpenSSL do:
//     about 18 µs instead of 40 here, one of the two X25519 operations of a handshake.
package stdpatch
