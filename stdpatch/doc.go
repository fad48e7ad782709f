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
//   - internal/poll (fd_unix.go, fd_poll_runtime.go) and runtime (netpoll.go,
//     netpoll_epoll.go): after a read of a TCP socket that returned fewer bytes than it
//     asked for, the next read waits for the poller's readiness before its system call,
//     instead of making a read that fails with EAGAIN first. The standard library clears
//     the readiness before each read; a short read leaves the socket's queue empty after
//     that clearing, so any bytes that arrive later are recorded as readiness (edge-
//     triggered epoll), and a read made without waiting would find nothing. An end of
//     stream or an error queued behind the bytes is announced once, possibly before the
//     clearing: the runtime's poller records that an event reported EPOLLRDHUP, EPOLLHUP
//     or EPOLLERR for the descriptor, and from then on its reads go the standard way (on
//     other systems than Linux, always). nginx reads the same way (ngx_unix_recv, with
//     its pending_eof from EPOLLRDHUP). Every other read path (RawConn, ReadMsg, splice)
//     clears the state and keeps the standard behaviour. A proxied keep-alive request
//     made four reads in l7d (client and backend, each an EAGAIN then the bytes) and now
//     makes two. TCP urgent data, which ends a read early with bytes behind it, is read
//     when more bytes or the deadline come. Tested by TestDrainedReadWaits (read system
//     calls per exchange, from /proc/self/io) and the tests of poll_test.go, which hold
//     for both builds (TestShortReadThenEndOfStream fails without the runtime's record);
//     Go's own net, os, net/http, crypto/tls and runtime tests pass on the patched tree.
package stdpatch
