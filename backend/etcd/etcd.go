package etcd

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Backend runs baton leases on etcd over one session lease per Backend. It is
// safe for concurrent use. One Backend stands for one process; it may hold any
// number of leases.
type Backend struct {
	client *clientv3.Client
	cfg    backend.Config
	ttlSec int64 // Config.TTL rounded up to whole seconds, as etcd grants them
	prefix string
	log    *slog.Logger

	// sessions owns the session lease, the goroutines and the lease
	// names this Backend campaigns for or holds. The key of a name is
	// derived from the session alone, so two campaigns for one name over
	// one session would share a key: a slot keeps them apart. While a key
	// whose creation may or may not have landed is being deleted in the
	// background, the name stays claimed, so that the clean-up cannot
	// delete a new campaign's key.
	sessions *backend.SessionManager[clientv3.LeaseID]
	// held watches the keys of the leases held.
	held *heldWatch

	// epochs follows the epoch keys this Backend reads, so that an epoch
	// it writes after etcd lost its data is above the old one, and the
	// loss is logged.
	epochs backend.EpochTracker
	// now is the wall clock an epoch written is taken from.
	now func() time.Time
	// txnLeases is how many leases a transaction of Leaders reads:
	// leadersPerTxn (zero), or fewer once the server refused that many.
	txnLeases atomic.Int64
}

var _ baton.Backend = (*Backend)(nil)

// New returns a Backend that campaigns through client. The client remains the
// caller's: Close does not close it.
func New(client *clientv3.Client, opts Options) (*Backend, error) {
	cfg, err := opts.config()
	if err != nil {
		return nil, err
	}
	if client == nil {
		return nil, &baton.ConfigError{Problems: []string{"etcd: client is nil: pass a *clientv3.Client from clientv3.New"}}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{
		client: client,
		cfg:    cfg,
		ttlSec: int64((cfg.TTL + time.Second - 1) / time.Second),
		prefix: opts.Prefix,
		log:    log.WithGroup("etcd"),
		now:    time.Now,
	}
	b.sessions = newSessions(b)
	b.held = newHeldWatch(b)
	return b, nil
}

// Config returns the timing the Backend uses, defaults filled in. TTL is as
// configured; the session's TTL is that rounded up to whole seconds, or more
// if etcd raised it.
func (b *Backend) Config() backend.Config { return b.cfg }

// Leader implements baton.Backend. It reports the candidate with the oldest
// key, which right after a holder stopped at its safe-until may still be that
// holder, until etcd expires its session, and the token its term has (read
// with the lease's epoch in one transaction). Record.Since is always zero:
// etcd keeps no times.
func (b *Backend) Leader(ctx context.Context, name string) (baton.Record, error) {
	if err := checkName(name); err != nil {
		return baton.Record{}, err
	}
	rec, _, err := b.leader(ctx, name)
	return rec, err
}

// leader is Leader for a checked name; it also returns the revision it
// read at.
func (b *Backend) leader(ctx context.Context, name string) (baton.Record, int64, error) {
	if b.sessions.Closed() {
		return baton.Record{}, 0, baton.ErrClosed
	}
	resp, err := b.client.Txn(ctx).Then(
		clientv3.OpGet(b.prefix+name+"/", clientv3.WithFirstCreate()...),
		clientv3.OpGet(b.epochKey(name)),
	).Commit()
	if err != nil {
		return baton.Record{}, 0, b.unavailable(ctx, "read election "+b.prefix+name+"/", err)
	}
	rev := resp.Header.Revision
	rec, err := b.recordOf(name, resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs)
	return rec, rev, err
}

// recordOf is the record of lease name as read from its election's oldest
// key (kvs) and its epoch key (ekvs).
func (b *Backend) recordOf(name string, kvs, ekvs []*mvccpb.KeyValue) (baton.Record, error) {
	if len(kvs) == 0 {
		return baton.Record{}, fmt.Errorf("%w for lease %q", baton.ErrNoLeader, name)
	}
	var e uint64
	if len(ekvs) > 0 {
		// No epoch key: a holder outside baton (etcdctl elect) on an etcd
		// where baton never campaigned for the lease; its token is the bare
		// revision.
		var err error
		if e, err = b.sawEpoch(name, ekvs); err != nil {
			return baton.Record{}, err
		}
	}
	kv := kvs[0]
	return baton.Record{Lease: name, Holder: string(kv.Value), Token: backend.EpochToken(e, uint64(kv.CreateRevision))}, nil
}

// Close ends every term this Backend holds (Err wraps baton.ErrClosed),
// revokes its session so that standbys take over at once, and waits for the
// goroutines it started. ctx bounds the revoke; if that fails, the keys
// expire after the TTL and Close returns the error. The client stays open.
// Later calls of Campaign and Leader return baton.ErrClosed; a second Close
// returns nil.
func (b *Backend) Close(ctx context.Context) error {
	return b.sessions.Close(ctx, nil)
}
