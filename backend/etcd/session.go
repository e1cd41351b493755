package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton/backend"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// sess is the Backend's etcd session lease and the baton leases riding on
// it.
//
// concurrency.Session is not used: its keep-alive replies do not say when
// the renewal they answer was sent, and safe-until must be measured from the
// send time of the last confirmed renewal.
type sess = backend.Session[clientv3.LeaseID]

// driver is the Backend's backend.SessionDriver: an etcd lease per session.
type driver struct{ b *Backend }

var _ backend.SessionDriver[clientv3.LeaseID] = driver{}

// newSessions returns the Manager of b's session leases.
func newSessions(b *Backend) *backend.SessionManager[clientv3.LeaseID] {
	return backend.NewSessionManager(driver{b}, backend.SessionOptions[clientv3.LeaseID]{
		Backend: "etcd",
		Config:  b.cfg,
		// The client waits for a connection rather than failing, so an
		// unreachable etcd would block a grant silently. Not below 5 s:
		// gRPC's reconnect back-off after a partition heals can take a few
		// seconds by itself.
		GrantTimeout: max(b.cfg.TTL, 5*time.Second),
		// By then etcd has expired the lease anyway.
		AbandonFor: time.Duration(b.ttlSec) * time.Second,
		Describe:   func(id clientv3.LeaseID) string { return fmt.Sprintf("etcd session %x", int64(id)) },
		Lost:       "expired or was revoked on the server",
		Log:        b.log,
	})
}

// Grant implements backend.SessionDriver.
func (d driver) Grant(ctx context.Context) (backend.SessionGrant[clientv3.LeaseID], error) {
	b := d.b
	start := time.Now()
	resp, err := b.client.Grant(ctx, b.ttlSec)
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseTTLTooLarge) {
			return backend.SessionGrant[clientv3.LeaseID]{}, &TTLError{TTL: time.Duration(b.ttlSec) * time.Second, Err: err}
		}
		return backend.SessionGrant[clientv3.LeaseID]{}, err
	}
	ttl := time.Duration(resp.TTL) * time.Second
	if ttl > b.cfg.TTL+time.Second {
		b.log.Info("etcd granted a longer TTL than asked: failover will take longer", "asked", b.cfg.TTL, "granted", ttl)
	}
	// safe-until is timed by the shorter of the granted TTL and our own
	// (backend.Config.SafeUntil): no reply stretches a term past the
	// client's own TTL from its send time.
	return backend.SessionGrant[clientv3.LeaseID]{
		ID: resp.ID, SafeUntil: b.cfg.SafeUntil(start, ttl), TTL: ttl, Span: min(ttl, b.cfg.TTL) - b.cfg.DriftMargin,
	}, nil
}

// Renew implements backend.SessionDriver.
func (d driver) Renew(ctx context.Context, id clientv3.LeaseID) (time.Time, error) {
	start := time.Now()
	resp, err := d.b.client.KeepAliveOnce(ctx, id)
	if err != nil {
		return time.Time{}, err
	}
	return d.b.cfg.SafeUntil(start, time.Duration(resp.TTL)*time.Second), nil
}

// Revoke implements backend.SessionDriver.
func (d driver) Revoke(ctx context.Context, id clientv3.LeaseID, _ bool) error {
	if _, err := d.b.client.Revoke(ctx, id); err != nil {
		return fmt.Errorf("etcd: revoke session lease %x (its keys expire after the TTL): %w", int64(id), err)
	}
	return nil
}

// Gone implements backend.SessionDriver.
func (driver) Gone(err error) bool { return isLeaseNotFound(err) }

func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound)
}
