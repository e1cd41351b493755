package etcd

import (
	"context"
	"fmt"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Campaign implements baton.Backend. The campaign's key is derived from the
// Backend's session, not from the candidate, so the Backend's candidates
// for one name take turns, first come, first served: one has a key in the
// election, the others wait in the process, and each enters the election
// at its back when its turn comes. etcd sees one key and one watch per
// Backend, whatever its number of candidates. A second Campaign by a
// candidate that already campaigns for or holds the name returns an error
// wrapping baton.ErrAlreadyCampaigning.
func (b *Backend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if c.ID == "" {
		return nil, fmt.Errorf("etcd: candidate ID must not be empty (lease %q)", name)
	}
	return b.sessions.Campaign(ctx, name, c.ID, func(sl *backend.Slot) (baton.Term, error) {
		return b.campaign(ctx, sl, name, c.ID)
	})
}

func (b *Backend) campaign(ctx context.Context, sl *backend.Slot, name, id string) (baton.Term, error) {
	pfx := b.prefix + name + "/"
	var (
		s   *sess
		key string
		rev int64
		ep  uint64
	)
	for retried := false; ; retried = true {
		var err error
		if s, err = b.sessions.Session(ctx); err != nil {
			return nil, err
		}
		key = fmt.Sprintf("%s%x", pfx, s.ID) // concurrency.Election's layout
		rev, ep, err = b.createKey(ctx, s, name, key, id)
		if err == nil {
			break
		}
		if isLeaseNotFound(err) && !retried {
			// etcd dropped the session before our keep-alive noticed: the
			// put did not happen, and a new session will do.
			b.sessions.Lost(s)
			continue
		}
		// The put may have landed though its reply was lost. A key left
		// behind would queue up and some day make us leader unknowingly.
		b.dropKey(s, sl, name, key, 0)
		return nil, b.campaignErr(ctx, s, name, "create election key "+key, err)
	}
	b.log.Debug("campaigning", "lease", name, "key", key, "rev", rev)
	for {
		// Read our key and our predecessor at one revision: a key deleted
		// while we waited (by an operator, say) must not become leader.
		resp, err := b.client.Txn(ctx).Then(
			clientv3.OpGet(key),
			clientv3.OpGet(pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))...),
		).Commit()
		if err != nil {
			b.dropKey(s, sl, name, key, rev)
			return nil, b.campaignErr(ctx, s, name, "read election "+pfx, err)
		}
		own := resp.Responses[0].GetResponseRange().Kvs
		if len(own) == 0 || own[0].CreateRevision != rev {
			if err := s.Err(); err != nil {
				return nil, b.campaignErr(ctx, s, name, "wait", err)
			}
			return nil, fmt.Errorf("%w: election key %s was deleted while waiting for lease %q", baton.ErrLeaseLost, key, name)
		}
		prev := resp.Responses[1].GetResponseRange().Kvs
		if len(prev) == 0 {
			return b.hold(s, sl, name, key, rev, ep, resp.Header.Revision)
		}
		if err := b.waitDelete(ctx, s, string(prev[0].Key), resp.Header.Revision+1); err != nil {
			if ctx.Err() != nil {
				b.dropKey(s, sl, name, key, rev)
			}
			return nil, b.campaignErr(ctx, s, name, "wait for "+string(prev[0].Key), err)
		}
	}
}

// createKey puts our key unless it exists, and returns its create revision
// and the lease's epoch, read in the same transaction: a key and an epoch
// from one incarnation of etcd's data.
func (b *Backend) createKey(ctx context.Context, s *sess, name, key, id string) (int64, uint64, error) {
	ekey := b.epochKey(name)
	for range 4 {
		resp, err := b.client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(ekey), ">", 0)).
			Then(clientv3.OpPut(key, id, clientv3.WithLease(s.ID)), clientv3.OpGet(ekey)).
			Else(clientv3.OpGet(key), clientv3.OpGet(ekey)).
			Commit()
		if err != nil {
			return 0, 0, err
		}
		ekvs := resp.Responses[1].GetResponseRange().Kvs
		if resp.Succeeded {
			e, err := b.sawEpoch(name, ekvs)
			if err != nil {
				// The key is ours, with a token nobody can compute.
				_ = b.deleteKey(ctx, key, resp.Header.Revision)
				return 0, 0, err
			}
			return resp.Header.Revision, e, nil
		}
		if len(ekvs) == 0 {
			if err := b.createEpoch(ctx, name); err != nil {
				return 0, 0, err
			}
			continue
		}
		// Our session already has a key here: one whose release failed, or
		// whose term a concurrent Resign is still releasing. Adopting it
		// would reuse an old term's token, so delete it and start afresh.
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		b.log.Debug("replacing a leftover key", "key", key, "rev", kvs[0].CreateRevision)
		if err := b.deleteKey(ctx, key, kvs[0].CreateRevision); err != nil {
			return 0, 0, err
		}
	}
	return 0, 0, fmt.Errorf("key %s keeps reappearing, or epoch key %s keeps vanishing", key, ekey)
}

// waitDelete returns nil once key may have been deleted after revision from
// (the caller reads again to find out), or an error when ctx or the session
// ends first.
func (b *Backend) waitDelete(ctx context.Context, s *sess, key string, from int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.Context(), cancel)()
	for wr := range b.client.Watch(wctx, key, clientv3.WithRev(from)) {
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return nil
			}
		}
		if wr.Err() != nil {
			return nil // compacted, say: read again and watch from there
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.Err(); err != nil {
		return err
	}
	// The client is closing; the caller's next read reports it.
	return nil
}

// campaignErr turns err into Campaign's error (see
// backend.SessionManager.CampaignErr).
func (b *Backend) campaignErr(ctx context.Context, s *sess, name, what string, err error) error {
	return b.sessions.CampaignErr(ctx, s, name, what, err)
}

func (b *Backend) unavailable(ctx context.Context, what string, err error) error {
	return backend.Unavailable(ctx, what, err)
}

// deleteKey deletes key if its create revision is rev; rev 0 means whatever
// is there, which only a campaign holding the name's slot may ask for.
func (b *Backend) deleteKey(ctx context.Context, key string, rev int64) error {
	if rev == 0 {
		resp, err := b.client.Get(ctx, key)
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		rev = resp.Kvs[0].CreateRevision
	}
	_, err := b.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpDelete(key)).
		Commit()
	return err
}

// dropKey deletes a campaign's key once, bounded by RenewInterval, and keeps
// trying in the background if that fails. The caller's context may have
// ended already, which is often why the key must go.
func (b *Backend) dropKey(s *sess, sl *backend.Slot, name, key string, rev int64) {
	if s.Context().Err() != nil {
		return // the key went, or goes, with the session
	}
	ctx, cancel := context.WithTimeout(s.Context(), b.cfg.RenewInterval)
	err := b.deleteKey(ctx, key, rev)
	cancel()
	if err != nil {
		b.log.Warn("could not delete an abandoned campaign's key; retrying in the background", "lease", name, "key", key, "err", err)
		b.cleanLater(s, sl, name, key, rev)
	}
}

// cleanLater retries deleteKey every RenewInterval until it succeeds or the
// session ends (which deletes the key too). While it runs it keeps sl, if sl
// is still the name's slot, so that no new campaign's key can be mistaken
// for the old one.
func (b *Backend) cleanLater(s *sess, sl *backend.Slot, name, key string, rev int64) {
	if s.Context().Err() != nil {
		return
	}
	b.sessions.CleanLater(sl, func() {
		backend.Retry(s.Context(), b.cfg.RenewInterval, b.cfg.RenewInterval, false, func(ctx context.Context) error {
			err := b.deleteKey(ctx, key, rev)
			if err != nil {
				b.log.Debug("leftover election key not deleted yet", "lease", name, "key", key, "err", err)
				return err
			}
			b.log.Info("deleted a leftover election key", "lease", name, "key", key)
			return nil
		})
	})
}
