package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/testkit/testenv"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// external is the etcd process the tests share (Debian's etcd-server), started by
// the first test that needs it and stopped by TestMain.
var external struct {
	once   sync.Once
	cmd    *exec.Cmd
	exited chan error // cmd.Wait's result
	dir    string
	cfg    Config // endpoints and TLS files of a client
	err    error
	skip   string
	log    testenv.LockedBuffer
}

func TestMain(m *testing.M) {
	code := m.Run()
	if external.cmd != nil {
		external.cmd.Process.Kill()
		<-external.exited
	}
	if external.dir != "" {
		os.RemoveAll(external.dir)
	}
	os.Exit(code)
}

// testLogger returns a logger whose output the test prints when it fails.
func testLogger(t testing.TB, level slog.Level) (*slog.Logger, *testenv.LockedBuffer) {
	buf := &testenv.LockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("store log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: level})), buf
}

// openEmbedded opens an embedded store in a new temporary directory, closed at the
// end of the test.
func openEmbedded(t testing.TB) *Store {
	t.Helper()
	log, _ := testLogger(t, slog.LevelWarn)
	s, err := Open(context.Background(), Config{Dir: t.TempDir(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
	})
	return s
}

// openExternal opens a store on the shared external etcd, emptied of the store's
// keys first, closed at the end of the test. It skips (or, strict, fails) without
// the etcd binary.
func openExternal(t testing.TB) *Store {
	t.Helper()
	testenv.RequireCommand(t, "etcd", "etcd-server")
	external.once.Do(startExternal)
	if external.err != nil {
		t.Fatalf("starting etcd: %v\n%s", external.err, external.log.String())
	}
	cfg := external.cfg
	cfg.Logger, _ = testLogger(t, slog.LevelWarn)
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("opening the external store: %v\netcd's log:\n%s", err, external.log.String())
	}
	if _, err := s.Client().Delete(context.Background(), "/tiergate/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
	})
	return s
}

// freePort returns a loopback TCP port that was free when asked.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startExternal starts etcd on loopback, on free ports, with TLS on its client port
// and client certificates required, settings as the embedded store's.
func startExternal() {
	dir, err := os.MkdirTemp("", "tiergate-etcd-")
	if err != nil {
		external.err = err
		return
	}
	external.dir = dir
	pki, err := testpki.NewMutualTLS(dir, "etcd", "etcd-server", []string{"127.0.0.1"}, "controld")
	if err != nil {
		external.err = err
		return
	}
	// The ports are free when picked; another process may take one before etcd
	// binds it, so a start that fails is tried again on new ones.
	for try := 0; try < 3; try++ {
		cport, err1 := freePort()
		pport, err2 := freePort()
		if err := errors.Join(err1, err2); err != nil {
			external.err = err
			return
		}
		client := "https://127.0.0.1:" + strconv.Itoa(cport)
		peer := "http://127.0.0.1:" + strconv.Itoa(pport)
		cmd := exec.Command("etcd",
			"--name", "ext", "--data-dir", filepath.Join(dir, fmt.Sprintf("data%d", try)),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "ext="+peer, "--initial-cluster-state", "new",
			"--cert-file", pki.ServerCert, "--key-file", pki.ServerKey,
			"--client-cert-auth", "--trusted-ca-file", pki.ClientCAFile,
			"--auto-compaction-mode", "revision", "--auto-compaction-retention", "10000",
			"--quota-backend-bytes", strconv.Itoa(DefaultQuotaBackendBytes),
			"--logger", "zap", "--log-level", "warn")
		cmd.Stdout, cmd.Stderr = &external.log, &external.log
		if err := cmd.Start(); err != nil {
			external.err = err
			return
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		cfg := Config{Endpoints: []string{client}, CertFile: pki.ClientCert, KeyFile: pki.ClientKey, CAFile: pki.ServerCAFile, DialTimeout: DefaultDialTimeout}
		ready := make(chan error, 1)
		go func() {
			c := cfg
			c.Logger = slog.New(slog.DiscardHandler)
			s, err := Open(context.Background(), c)
			if err == nil {
				s.Close()
			}
			ready <- err
		}()
		select {
		case err := <-ready:
			if err == nil {
				external.cmd, external.exited, external.cfg, external.err = cmd, exited, cfg, nil
				return
			}
			external.err = err
			cmd.Process.Kill()
			<-exited
		case err := <-exited:
			external.err = fmt.Errorf("etcd exited: %v", err)
			<-ready
		}
	}
}

// waitFor receives from ch within a bound, or fails the test.
func waitFor[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
	}
	panic("unreachable")
}

// backends runs fn against the embedded store and the external one.
func backends(t *testing.T, fn func(t *testing.T, s *Store)) {
	t.Run("embedded", func(t *testing.T) { fn(t, openEmbedded(t)) })
	t.Run("external", func(t *testing.T) { fn(t, openExternal(t)) })
}
