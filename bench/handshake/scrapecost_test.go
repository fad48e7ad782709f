package main

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestPacer checks that operations taken from several workers at once are spaced
// by the pacer's interval: 200 slots at 1ms take about 200ms, not less.
func TestPacer(t *testing.T) {
	p := &pacer{interval: time.Millisecond}
	start := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				if err := p.wait(context.Background()); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if took := time.Since(start); took < 199*time.Millisecond || took > 2*time.Second {
		t.Errorf("200 slots 1ms apart took %v", took)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.next = time.Now().Add(time.Hour)
	if err := p.wait(ctx); err == nil {
		t.Error("a wait past a cancelled context returned no error")
	}
}
