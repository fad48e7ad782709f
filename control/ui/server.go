package ui

import (
	"context"
	"embed"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tiergate/tiergate/control/api"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/daemon"
)

// UPlotVersion is the version of the npm package uplot whose files are in
// assets/, UPlotIntegrity the npm registry's integrity of its tarball, and
// UPlotSHA256 each vendored file's SHA-256 (checked by TestAssetsPinned and by
// `make ui-assets`).
const (
	UPlotVersion   = "1.6.32"
	UPlotIntegrity = "sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
)

// UPlotSHA256 are the SHA-256 of the vendored files of uplot's dist/.
var UPlotSHA256 = map[string]string{
	"uPlot.iife.min.js": "19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f",
	"uPlot.min.css":     "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
}

//go:embed assets
var assets embed.FS

// Config is the dashboard's settings.
type Config struct {
	// Tokens checks the bearer token of /v1/ui/dashboard (any role reads).
	// Required.
	Tokens *api.Tokens
	// Store is where the nodes to scrape are read (their statuses). Required
	// unless Prometheus is set.
	Store *store.Store
	// Prometheus is a Prometheus server's URL to query instead of scraping the
	// nodes. Default none: controld scrapes them.
	Prometheus string
	// Interval is the time between scrapes (and points). Default DefaultInterval (2s).
	Interval time.Duration
	// Logger logs. Default slog.Default().
	Logger *slog.Logger
}

// Mount starts the source Config says (a Scraper runs until ctx is done) and
// registers the page's routes on mux.
func Mount(ctx context.Context, mux *http.ServeMux, cfg Config) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var src Source
	if cfg.Prometheus != "" {
		p, err := NewPrometheus(PrometheusConfig{URL: cfg.Prometheus, Step: cfg.Interval})
		if err != nil {
			return err
		}
		src = p
		cfg.Logger.Info("ui: the dashboard's figures come from Prometheus", "url", cfg.Prometheus)
	} else {
		if cfg.Store == nil {
			return errors.New("ui: a store is needed to find the nodes to scrape")
		}
		s := NewScraper(ScraperConfig{Nodes: StoreNodes(cfg.Store), Interval: cfg.Interval, Logger: cfg.Logger})
		go s.Run(ctx)
		src = s
	}
	h := &Handler{Source: src, Authenticate: func(ctx context.Context, tok string) (bool, error) {
		_, ok, err := cfg.Tokens.Authenticate(ctx, tok)
		return ok, err
	}}
	h.Register(mux)
	return nil
}

// Handler serves the page, its assets and the dashboard's JSON.
type Handler struct {
	Source Source
	// Authenticate checks a bearer token.
	Authenticate func(ctx context.Context, token string) (bool, error)
}

// Register adds the routes to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	static, _ := fs.Sub(assets, "assets")
	files := http.FileServerFS(static)
	mux.HandleFunc("GET /ui", h.page)
	mux.HandleFunc("GET /ui/{$}", h.page)
	mux.Handle("GET /ui/assets/", http.StripPrefix("/ui/assets/", noStore(files)))
	mux.HandleFunc("GET /v1/ui/dashboard", h.dashboard)
}

// noStore marks answers not to be cached: the page and its script change with
// the binary.
func noStore(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}

// securityHeaders are those of the page: nothing from another host.
func securityHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
}

func (h *Handler) page(w http.ResponseWriter, r *http.Request) {
	data, err := assets.ReadFile("assets/index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	securityHeaders(w)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Write(data)
}

func (h *Handler) dashboard(w http.ResponseWriter, r *http.Request) {
	presented, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		w.Header().Set("WWW-Authenticate", "Bearer")
		daemon.WriteError(w, daemon.Errorf(http.StatusUnauthorized, daemon.CodeUnauthorized, "a bearer token is required"))
		return
	}
	ok, err := h.Authenticate(r.Context(), strings.TrimSpace(presented))
	if err != nil {
		daemon.WriteError(w, daemon.Wrap(http.StatusServiceUnavailable, daemon.CodeUnavailable, "checking the token", err))
		return
	}
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		daemon.WriteError(w, daemon.Errorf(http.StatusUnauthorized, daemon.CodeUnauthorized, "the token is not valid"))
		return
	}
	window := 15 * time.Minute
	if v := r.URL.Query().Get("window"); v != "" {
		sec, err := strconv.Atoi(v)
		if err != nil || sec <= 0 || time.Duration(sec)*time.Second > DefaultHistory {
			daemon.WriteError(w, daemon.Errorf(http.StatusBadRequest, daemon.CodeBadRequest, "window %q: want seconds, 1 to %d", v, int(DefaultHistory.Seconds())))
			return
		}
		window = time.Duration(sec) * time.Second
	}
	d, err := h.Source.Dashboard(r.Context(), window)
	if err != nil {
		daemon.WriteError(w, daemon.Wrap(http.StatusBadGateway, "source_failed", "gathering the dashboard's figures", err))
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	daemon.WriteJSON(w, http.StatusOK, d)
}
