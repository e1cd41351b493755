package zookeeper

import (
	"context"
	"errors"
	"time"

	"github.com/batonhq/baton"
	"github.com/go-zookeeper/zk"
)

// call runs op, a request on the client, and waits for its reply until ctx
// ends. go-zookeeper's requests take no context: they wait for a reply, or
// for the connection to fail, which a partition can make take several
// session timeouts. Close abandons every call (with baton.ErrClosed). An
// abandoned op finishes in the background; its result is dropped, so op
// must not change anything the caller reads.
func call[T any](ctx context.Context, b *Backend, op func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	var zero T
	if !b.goCall(func() {
		v, err := op()
		done <- result{v, err}
	}) {
		return zero, baton.ErrClosed
	}
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-b.ctx.Done():
		return zero, baton.ErrClosed
	}
}

// goCall runs f in a goroutine counted in b.calls, unless Close stopped
// counting, and reports whether it did.
func (b *Backend) goCall(f func()) bool {
	b.callMu.Lock()
	defer b.callMu.Unlock()
	if b.callsDone {
		return false
	}
	b.calls.Go(f)
	return true
}

// retry is call, repeated while op fails because the client is between
// connections: go-zookeeper fails the requests it holds with ErrNoServer
// each time it has tried every server in vain, and those it had sent with
// ErrConnectionClosed when a connection breaks. Such a request did not
// happen, or (a create) is resolved by its caller, so asking again once
// the client is back is right. It gives up when ctx ends, the Backend
// closes, or session generation s (if not nil) ends, returning op's last
// error.
func retry[T any](ctx context.Context, b *Backend, s *sess, op func() (T, error)) (T, error) {
	var done <-chan struct{}
	if s != nil {
		done = s.Context().Done()
	}
	for {
		v, err := call(ctx, b, op)
		if err == nil || !transient(err) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-b.ctx.Done():
			return v, err
		case <-done:
			return v, err
		case <-time.After(retryPause):
		}
	}
}

// retryPause is how long retry waits before asking again.
const retryPause = 50 * time.Millisecond

// transient reports whether err says the client had no connection for the
// request, rather than that the server refused it.
func transient(err error) bool {
	return errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrConnectionClosed)
}
