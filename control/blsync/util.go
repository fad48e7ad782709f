package blsync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/tiergate/tiergate/control/store"
)

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// wrapErr maps etcd's errors to the store's, keeping etcd's text.
func wrapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%w (%v)", store.ErrCompacted, err)
	case errors.Is(err, rpctypes.ErrNoSpace):
		return fmt.Errorf("%w (%v)", store.ErrNoSpace, err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return fmt.Errorf("%w (%v)", store.ErrTooLarge, err)
	}
	return err
}

// parallel runs fn for 0..n-1, four at a time, and returns the first error; after
// one, the others' context is cancelled and no more are started.
func parallel(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(ctx, i); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return first
}
