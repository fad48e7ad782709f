package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// serveBackendCommand is the hidden first argument that makes this program the Go
// backend of -backend go: fasthttp answering requestPath with body, and its request
// count at /stats.
const serveBackendCommand = "serve-backend"

func serveBackend(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench-policy "+serveBackendCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "`address` to serve HTTP/1.1 on")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "bench-policy %s: %v\n", serveBackendCommand, err)
		return 1
	}
	var served atomic.Int64
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			switch string(ctx.Path()) {
			case requestPath:
				served.Add(1)
				ctx.SetContentType("application/octet-stream")
				ctx.SetBody(body)
			case "/stats":
				ctx.SetBodyString(strconv.FormatInt(served.Load(), 10))
			default:
				ctx.SetStatusCode(fasthttp.StatusNotFound)
			}
		},
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		IdleTimeout:           75 * time.Second,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Shutdown()
	}()
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintf(stderr, "bench-policy %s: %v\n", serveBackendCommand, err)
		return 1
	}
	return 0
}
