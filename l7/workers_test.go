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

// idleWorkers is how many workers are idle.
func idleWorkers(w *workers) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ready)
}

// waitIdle waits until n workers are idle.
func waitIdle(t *testing.T, w *workers, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for idleWorkers(w) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers idle after 5s, want %d", idleWorkers(w), n)
		}
		time.Sleep(time.Millisecond)
	}
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
		waitIdle(t, w, 1)
		c := &tcpConn{}
		w.run(c)
		<-done
		mu.Lock()
		if served[c] != served[first] {
			t.Fatalf("connection %d served by goroutine %d, want the first one's %d", i, served[c], served[first])
		}
		mu.Unlock()
	}
	w.close()
}

// TestWorkersLIFO: of several idle workers, the one that became idle last serves
// the next connection.
func TestWorkersLIFO(t *testing.T) {
	type job struct {
		release chan struct{}
		id      chan int
	}
	jobs := map[*tcpConn]job{}
	var mu sync.Mutex
	w := newWorkers(func(c *tcpConn) {
		mu.Lock()
		j := jobs[c]
		mu.Unlock()
		j.id <- goid()
		<-j.release
	}, time.Hour)
	defer w.close()
	start := func() (*tcpConn, job) {
		c, j := &tcpConn{}, job{release: make(chan struct{}), id: make(chan int, 1)}
		mu.Lock()
		jobs[c] = j
		mu.Unlock()
		w.run(c)
		return c, j
	}
	var ids []int
	var held []job
	for range 3 {
		_, j := start()
		ids = append(ids, <-j.id)
		held = append(held, j)
	}
	// They become idle in the order 2, 0, 1: worker 1 is the last.
	for i, k := range []int{2, 0, 1} {
		close(held[k].release)
		waitIdle(t, w, i+1)
	}
	for _, want := range []int{ids[1], ids[0], ids[2]} {
		_, j := start()
		defer close(j.release)
		if got := <-j.id; got != want {
			t.Fatalf("served by goroutine %d, want %d (the idle one taken last of %v)", got, want, ids)
		}
	}
}

// TestWorkersSweep: the sweep ends the workers idle for longer than idle, and only
// those; it ends the others once their time comes.
func TestWorkersSweep(t *testing.T) {
	const idle = 2 * time.Second // the sweep may fire up to idle/2 late on a busy machine
	release := make(chan struct{}, 2)
	w := newWorkers(func(*tcpConn) { <-release }, idle)
	defer w.close()
	w.run(&tcpConn{})
	w.run(&tcpConn{})
	release <- struct{}{}
	waitIdle(t, w, 1)
	time.Sleep(idle / 2)
	release <- struct{}{}
	waitIdle(t, w, 2)
	// The first worker's time comes before the second's.
	deadline := time.Now().Add(5 * time.Second)
	for idleWorkers(w) == 2 {
		if time.Now().After(deadline) {
			t.Fatal("no idle worker ended within 5s")
		}
		time.Sleep(time.Millisecond)
	}
	w.mu.Lock()
	left := len(w.ready)
	var since time.Duration
	if left == 1 {
		since = time.Since(w.ready[0].since)
	}
	w.mu.Unlock()
	if left != 1 || since >= idle {
		t.Fatalf("after the first sweep %d idle workers, the rest idle for %s; want the younger one, idle less than %s", left, since, idle)
	}
	waitIdle(t, w, 0)
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
