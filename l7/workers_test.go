package l7

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// goid is the calling goroutine's ID, from its stack trace's first line.
func goid() int {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := bytes.Fields(buf)
	id, _ := strconv.Atoi(string(f[1]))
	return id
}

func TestWorkersReuse(t *testing.T) {
	var mu sync.Mutex
	served := map[*tcpConn]int{}
	done := make(chan *tcpConn, 16)
	w := newWorkers(func(c *tcpConn) {
		mu.Lock()
		served[c] = goid()
		mu.Unlock()
		done <- c
	}, time.Hour)
	first := &tcpConn{}
	w.run(first)
	<-done
	// The worker that served first takes the next connection once it is idle.
	for i := 0; i < 5; i++ {
		c := &tcpConn{}
		deadline := time.Now().Add(5 * time.Second)
		for sent := false; !sent; {
			select {
			case w.ready <- c:
				sent = true
			default:
				if time.Now().After(deadline) {
					t.Fatal("no worker became idle within 5s")
				}
				runtime.Gosched()
			}
		}
		<-done
		mu.Lock()
		if served[c] != served[first] {
			t.Fatalf("connection %d served by goroutine %d, want the first one's %d", i, served[c], served[first])
		}
		mu.Unlock()
	}
	w.close()
}

func TestWorkersConcurrent(t *testing.T) {
	release := make(chan struct{})
	var busy sync.WaitGroup
	ids := make(chan int, 8)
	w := newWorkers(func(c *tcpConn) {
		ids <- goid()
		busy.Done()
		<-release
	}, time.Hour)
	busy.Add(4)
	for range 4 {
		w.run(&tcpConn{})
	}
	busy.Wait() // four connections at once need four workers
	close(ids)
	seen := map[int]bool{}
	for id := range ids {
		seen[id] = true
	}
	if len(seen) != 4 {
		t.Fatalf("4 connections served at once on %d goroutines, want 4", len(seen))
	}
	closed := make(chan struct{})
	go func() { w.close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("close returned while workers were still serving")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("close did not return after the connections ended")
	}
}

func TestWorkersIdleEnd(t *testing.T) {
	w := newWorkers(func(*tcpConn) {}, 10*time.Millisecond)
	w.run(&tcpConn{})
	ended := make(chan struct{})
	go func() { w.wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("an idle worker did not end after its idle time")
	}
}
