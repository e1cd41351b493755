package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/batonhq/baton"
)

var _ baton.LeaderWatcher = (*Backend)(nil)

// WatchLeader implements baton.LeaderWatcher. It reads the Lease once, then
// watches it from the resourceVersion it read, and hands fn the holder each
// watch event names: no read per change, and nothing while nothing
// changes but the holder's renewals, which it does not pass on. It reads
// again only when the server ends the watch.
//
// fn gets what Leader would return: the holder the Lease names, or an error
// wrapping baton.ErrNoLeader when holderIdentity is empty (released) or the
// Lease does not exist. A holder that died is still named until a
// candidate that campaigned has seen its Lease unrenewed for a full lease
// duration and taken it over; the watch then names the new holder. A
// standby therefore never hears "nobody" for a crashed holder: it hears
// the successor, from the successor's write, at once.
func (b *Backend) WatchLeader(ctx context.Context, name string, fn func(baton.Record, error)) error {
	if err := CheckLeaseName(name); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(b.closed, cancel)()
	ended := func() error {
		if b.closed.Err() != nil {
			return baton.ErrClosed
		}
		return ctx.Err()
	}
	const retryMin = 100 * time.Millisecond
	retry := retryMin
	// lastKey is the last answer passed to fn, "" after an error: the
	// holder's renewals, and a read after a watch restart, say nothing new.
	lastKey := ""
	report := func(rec baton.Record, err error) {
		key := ""
		switch {
		case err == nil:
			key = fmt.Sprintf("holder %q token %d since %d", rec.Holder, rec.Token, rec.Since.UnixNano())
		case errors.Is(err, baton.ErrNoLeader):
			key = "nobody"
		}
		if key != "" && key == lastKey {
			return
		}
		lastKey = key
		fn(rec, err)
	}
	leases := b.store.leases
	for {
		rv := ""
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if ended() != nil {
			return ended()
		}
		switch {
		case apierrors.IsNotFound(err):
			report(baton.Record{}, b.noLeader(name))
		case err != nil:
			report(baton.Record{}, fmt.Errorf("%w: kubernetes: read Lease %s/%s: %w", baton.ErrBackendUnavailable, b.store.namespace, name, err))
		default:
			rv = l.ResourceVersion
			report(b.recordOf(name, l))
		}
		if err != nil && !apierrors.IsNotFound(err) {
			select {
			case <-ctx.Done():
				return ended()
			case <-time.After(retry):
			}
			retry = min(2*retry, b.Config().TTL)
			continue
		}
		// Watching from the read's resourceVersion misses no change; with
		// no Lease to take one from, a watch from "" starts with the
		// Lease's current state, if it was created since.
		w, err := b.store.watch(ctx, name, rv)
		if ended() != nil {
			if w != nil {
				w.Stop()
			}
			return ended()
		}
		if err != nil {
			report(baton.Record{}, fmt.Errorf("%w: kubernetes: watch Lease %s/%s: %w", baton.ErrBackendUnavailable, b.store.namespace, name, err))
			select {
			case <-ctx.Done():
				return ended()
			case <-time.After(retry):
			}
			retry = min(2*retry, b.Config().TTL)
			continue
		}
		began := time.Now()
		b.follow(ctx, name, w, report)
		w.Stop()
		if ended() != nil {
			return ended()
		}
		// A watch the server ends at once, again and again (an error
		// event each time, say), is retried with back-off, not in a loop.
		if time.Since(began) >= watchHealthy {
			retry = retryMin
			continue
		}
		select {
		case <-ctx.Done():
			return ended()
		case <-time.After(retry):
		}
		retry = min(2*retry, b.Config().TTL)
	}
}

// watchHealthy is how long a watch must have lasted for WatchLeader to
// start it again at once when it ends.
const watchHealthy = 5 * time.Second

// follow passes the holder named by each of w's events to report, until w
// ends (the server closed it, or an error event such as 410 Gone: the
// caller reads again and watches from there) or ctx does.
func (b *Backend) follow(ctx context.Context, name string, w watch.Interface, report func(baton.Record, error)) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			switch ev.Type {
			case watch.Error:
				return
			case watch.Deleted:
				report(baton.Record{}, b.noLeader(name))
			case watch.Added, watch.Modified:
				if l, ok := ev.Object.(*coordinationv1.Lease); ok && l.Name == name {
					report(b.recordOf(name, l))
				}
			}
		}
	}
}

// recordOf is what Leader says of Lease l.
func (b *Backend) recordOf(name string, l *coordinationv1.Lease) (baton.Record, error) {
	rec, _, err := b.store.decode(l)
	if err != nil {
		return baton.Record{}, err
	}
	if rec.Holder == "" {
		return baton.Record{}, b.noLeader(name)
	}
	return baton.Record{Lease: name, Holder: rec.Holder, Token: rec.Token, Since: rec.Since}, nil
}

func (b *Backend) noLeader(name string) error {
	return fmt.Errorf("%w for lease %q", baton.ErrNoLeader, name)
}
