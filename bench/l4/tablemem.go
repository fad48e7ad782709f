package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/tiergate/tiergate/l4/conntrack"
	"github.com/tiergate/tiergate/l4/packet"
)

// tableResult is the connection-table memory measurement.
type tableResult struct {
	Entries     int     `json:"entries"`
	EntrySize   int     `json:"entry_size_bytes"`
	MemoryBytes int     `json:"memory_bytes"`
	PerEntry    float64 `json:"bytes_per_entry"` // MemoryBytes / capacity
	HeapBytes   int64   `json:"heap_growth_bytes"`
	RSSBytes    int64   `json:"rss_growth_bytes"`
	InsertNs    float64 `json:"insert_ns"`
}

// measureTable makes a table of n entries, inserts n distinct established connections
// and reports its memory three ways: what the table says it holds, the Go heap's
// growth, and the process's resident set growth.
func measureTable(n int) (*tableResult, error) {
	heap0, rss0, err := memNow()
	if err != nil {
		return nil, err
	}
	t, err := conntrack.New(conntrack.Config{Capacity: n})
	if err != nil {
		return nil, fmt.Errorf("connection table of %d: %w", n, err)
	}
	now := conntrack.Clock(time.Now())
	seed := uint64(0x9e3779b97f4a7c15)
	p := packet.Packet{Dst: vip, DstPort: vipPort, Proto: packet.ProtoTCP}
	start := time.Now()
	for i := range n {
		client, cport := flowClient(i)
		p.Src, p.SrcPort = client, cport
		k := conntrack.Key{Client: client.As16(), ClientPort: cport}
		if _, ok := t.Insert(&k, packet.FlowHash(seed, &p), uint16(i%len(memberAddr)), conntrack.StateEstablished, now); !ok {
			return nil, fmt.Errorf("connection table of %d: insert %d failed (%d entries)", n, i, t.Len())
		}
	}
	el := time.Since(start)
	if t.Len() != n {
		return nil, fmt.Errorf("connection table of %d: holds %d entries after %d inserts", n, t.Len(), n)
	}
	heap1, rss1, err := memNow()
	if err != nil {
		return nil, err
	}
	r := &tableResult{
		Entries:     n,
		EntrySize:   int(conntrack.EntrySize()),
		MemoryBytes: t.MemoryBytes(),
		PerEntry:    float64(t.MemoryBytes()) / float64(t.Cap()),
		HeapBytes:   int64(heap1) - int64(heap0),
		RSSBytes:    rss1 - rss0,
		InsertNs:    float64(el.Nanoseconds()) / float64(n),
	}
	runtime.KeepAlive(t)
	return r, nil
}

// memNow collects garbage and returns the live Go heap and the resident set size.
func memNow() (heap uint64, rss int64, err error) {
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, err = vmRSS()
	return ms.HeapAlloc, rss, err
}

// vmRSS returns VmRSS from /proc/self/status in bytes.
func vmRSS() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("reading the resident set size: %w", err)
	}
	defer f.Close()
	return parseVmRSS(f)
}

// parseVmRSS reads the VmRSS line of a /proc/PID/status.
func parseVmRSS(f io.Reader) (int64, error) {
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		fs := strings.Fields(rest)
		if len(fs) != 2 || fs[1] != "kB" {
			return 0, fmt.Errorf("/proc/self/status: unexpected VmRSS line %q", sc.Text())
		}
		kb, err := strconv.ParseInt(fs[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/self/status: VmRSS %q: %w", fs[0], err)
		}
		return kb * 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("/proc/self/status: no VmRSS line")
}
