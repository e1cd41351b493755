package dynamodb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// API is what a Backend needs of a DynamoDB client: *dynamodb.Client has
// it. The caller owns the client.
type API interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	// BatchGetItem reads the leases a process waits on, 100 a request.
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
}

// Backend runs baton leases in a DynamoDB table. One Backend stands for
// one process: it holds one session item, renewed by one UpdateItem per
// RenewInterval however many leases it holds; each lease's item names the
// session it rides on. It is safe for concurrent use; it allows one
// campaign per lease name at a time, whatever the candidate.
type Backend struct {
	db       API // limited to Options.MaxRequests at a time
	direct   API // the client itself, for the session's renewals
	o        options
	sessions *backend.SessionManager[string]
	epochs   backend.EpochTracker
	reader   *backend.BatchReader[leaseItem]

	// held is the latest term this Backend won of each lease name, until
	// it resigns, for Close to free (releases are conditional on the
	// term's token, so a term that ended otherwise frees nothing).
	held sync.Map // string → *term

	// checked is the last check that this process's session item exists,
	// made before creating a lease's item (see acquire).
	checkMu sync.Mutex
	checked struct {
		session string
		sent    time.Time
	}
}

var (
	_ baton.Backend   = (*Backend)(nil)
	_ baton.StateTerm = (*term)(nil)
)

// New returns a Backend on client, which the caller owns. Unless
// Options.NoCheck, it checks with DescribeTable that Options.Table exists
// with baton's key, and returns a *TableError (which matches
// *baton.ConfigError) when it is missing or access is denied. Bad options
// give a *baton.ConfigError naming every problem. ctx bounds the check.
func New(ctx context.Context, client API, opts Options) (*Backend, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if client == nil {
		return nil, &baton.ConfigError{Problems: []string{"dynamodb: the client is nil: pass a *dynamodb.Client from dynamodb.NewFromConfig"}}
	}
	if !o.NoCheck {
		tc, ok := client.(TableAPI)
		if !ok {
			return nil, &baton.ConfigError{Problems: []string{"dynamodb: the client has no DescribeTable: set Options.NoCheck, or pass a *dynamodb.Client"}}
		}
		if err := checkTable(ctx, tc, o.Table); err != nil {
			return nil, err
		}
	}
	b := &Backend{db: limited{API: client, ops: make(chan struct{}, o.maxRequests)}, direct: client, o: o}
	b.sessions = backend.NewSessionManager(driver{b}, backend.SessionOptions[string]{
		Backend: "dynamodb",
		Config:  o.cfg,
		// A grant that takes longer than a TTL is of no use to a
		// campaign: report DynamoDB unavailable instead.
		GrantTimeout: o.cfg.TTL,
		// By then every contender has seen it unrenewed for a TTL.
		AbandonFor: o.cfg.TTL,
		Describe:   func(id string) string { return "dynamodb session " + id },
		Lost:       "was marked dead by a contender that saw it unrenewed for a TTL, or deleted from table " + o.Table,
		Unavailable: func(ctx context.Context, what string, err error) error {
			if reason := configProblem(err); reason != "" && !tableMissing(err) {
				return &TableError{Table: o.Table, Reason: reason, Err: err}
			}
			return backend.Unavailable(ctx, what, err)
		},
		Log: o.log,
	})
	b.reader = newBatchReader(b)
	b.sessions.Go(func() { b.reader.Run(b.sessions.Context()) })
	return b, nil
}

// Config returns the timing the Backend uses, defaults filled in.
func (b *Backend) Config() backend.Config { return b.o.cfg }

// Table returns the table's name.
func (b *Backend) Table() string { return b.o.Table }

// Close ends every term of this Backend (Err wraps baton.ErrClosed),
// frees its leases and marks its session item dead, so that waiters take
// them at their next poll, and waits for its goroutines, within ctx. The
// client is the caller's.
func (b *Backend) Close(ctx context.Context) error {
	return b.sessions.Close(ctx, func(s *backend.Session[string]) error {
		if s == nil {
			return nil
		}
		var errs []error
		b.held.Range(func(_, v any) bool {
			if t := v.(*term); t.s == s {
				if err := b.releaseItem(ctx, t.name, t.Token(), s.ID); err != nil {
					errs = append(errs, err)
				}
			}
			return true
		})
		return errors.Join(errs...)
	})
}

// reqCtx bounds one request of a campaign or a release: never longer than
// the TTL, so that a hung request cannot hold a campaign past the point
// where its session is useless.
func (b *Backend) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.o.cfg.TTL)
}

// MaxNameLen is the longest lease name, in bytes, that Campaign takes: the
// item's partition key (at most 2,048 bytes) is LeasePrefix + the name.
const MaxNameLen = 1024

// Campaign implements baton.Backend.
func (b *Backend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	if name == "" || c.ID == "" {
		return nil, fmt.Errorf("dynamodb: lease name and candidate ID must not be empty (name %q, id %q)", name, c.ID)
	}
	if len(name) > MaxNameLen {
		return nil, fmt.Errorf("dynamodb: lease name of %d bytes is longer than %d (dynamodb.MaxNameLen): it is the item's partition key", len(name), MaxNameLen)
	}
	return b.sessions.Campaign(ctx, name, c.ID, func(sl *backend.Slot) (baton.Term, error) {
		return b.campaign(ctx, sl, name, c.ID)
	})
}

// seen is a holder's session as a waiter last read it, and when (its own
// monotonic clock) it first read that renewal count.
type seen struct {
	session  string
	renewals int64
	at       time.Time
}

func (b *Backend) campaign(ctx context.Context, sl *backend.Slot, name, id string) (baton.Term, error) {
	var (
		last    seen
		batched *backend.BatchResult[leaseItem] // the lease as a batch read it, to go by instead of reading it
	)
	for {
		s, err := b.sessions.Session(ctx)
		if err != nil {
			return nil, err
		}
		var (
			r   leaseItem
			now time.Time
		)
		if batched != nil {
			r, now = batched.Value, batched.At
			r.readAt = batched.Sent
			batched = nil
		} else {
			readAt := time.Now()
			r, err = b.read(ctx, name)
			if err != nil {
				return nil, b.campaignErr(ctx, s, name, "read lease", err)
			}
			r.readAt = readAt
			now = time.Now()
		}
		var (
			take bool
			dead string
			left time.Duration
		)
		switch {
		case !r.exists, r.holder == "", r.session == "", r.session == s.ID:
			// Free, or left by our own session: nobody acts on it.
			take = true
		case r.sessionDead:
			// A contender saw the session unrenewed for a TTL (and
			// marked it so that no renewal lands again), or its process
			// closed it: its holder's safe-until has passed.
			take = true
		case last.session != r.session || last.renewals != r.renewals:
			// A session item that is gone reads as renewal count -1: it
			// was deleted by DynamoDB's TTL an hour or more after its last
			// renewal, or by an operator, and its holder may not know yet.
			// It is timed like a live one.
			last = seen{session: r.session, renewals: r.renewals, at: now}
			left = r.ttl(b.o.cfg.TTL)
		default:
			left = r.ttl(b.o.cfg.TTL) - now.Sub(last.at)
			if left <= 0 {
				b.o.log.Info("taking over a lease whose holder's session went unrenewed for a full TTL",
					"lease", name, "from", r.holder, "session", r.session, "ttl", r.ttl(b.o.cfg.TTL))
				take = true
				if r.renewals >= 0 {
					dead = r.session
				}
			}
		}
		if take {
			t, err := b.acquire(ctx, s, sl, name, id, r, dead, last.renewals)
			if t != nil || err != nil {
				return t, err
			}
			// Another contender won the race, or the session we saw
			// renewed meanwhile: read again.
			last = seen{}
			continue
		}
		// The lease is read again at its next poll, in a batch with the
		// other waiters' leases (or by itself, where batches are refused).
		due := now.Add(max(min(left, b.o.poll), time.Millisecond))
		req, cancel := b.reader.Request(name, due)
		if req == nil {
			timer := time.NewTimer(time.Until(due))
			select {
			case <-ctx.Done():
				timer.Stop()
				return nil, ctx.Err()
			case <-s.Context().Done():
				timer.Stop()
			case <-timer.C:
			}
			continue
		}
		select {
		case <-ctx.Done():
			cancel()
			return nil, ctx.Err()
		case <-s.Context().Done():
			cancel()
		case res := <-req.Result():
			if res.Err == nil {
				batched = &res
			}
			// A failed batch: the waiter reads the lease itself, which
			// reports the error.
		}
	}
}

// campaignErr is SessionManager.CampaignErr, except that a denied access
// or refused credentials is a *TableError, which stops the Elector. A
// table that went missing after New found it is an outage (being made
// again, say), retried.
func (b *Backend) campaignErr(ctx context.Context, s *backend.Session[string], name, what string, err error) error {
	if reason := configProblem(err); reason != "" && ctx.Err() == nil && !tableMissing(err) {
		return &TableError{Table: b.o.Table, Reason: reason, Err: err}
	}
	return b.sessions.CampaignErr(ctx, s, name, what, err)
}

// acquire takes lease name for candidate id on session s, from the item r
// read before: free, or (dead not empty) from session dead, whose renewal
// count stayed renewals for a TTL. It returns (nil, nil) when the item or
// the dead session changed meanwhile, so that the caller reads again.
func (b *Backend) acquire(ctx context.Context, s *backend.Session[string], sl *backend.Slot, name, id string, r leaseItem, dead string, renewals int64) (baton.Term, error) {
	if dead != "" {
		// Mark the dead session so, only at the renewal count seen
		// unchanged for a TTL: a renewal that lands first makes this
		// fail (and the session lives on); one that comes after fails
		// itself, and its process learns that it lost every lease on the
		// session, which its safe-until had ended already.
		ok, err := b.killSession(ctx, dead, renewals)
		if err != nil {
			return nil, b.campaignErr(ctx, s, name, "mark dead session", err)
		}
		if !ok {
			return nil, nil
		}
	}
	if !r.exists {
		ok, err := b.sessionExists(ctx, s, r.readAt)
		if err != nil {
			return nil, b.campaignErr(ctx, s, name, "check session", err)
		}
		if !ok {
			b.sessions.Lost(s)
			return nil, nil
		}
	}
	token := r.token + 1
	if !r.exists || r.token>>32 == 0 {
		// A new item: the table may have lost an older one, whose tokens
		// this one must outrank.
		token = max(token, backend.EpochToken(b.epochs.Next(name, time.Now()), r.token&math.MaxUint32+1))
	}
	in := &dynamodb.UpdateItemInput{
		TableName: aws.String(b.o.Table),
		Key:       leaseKey(name),
		// The token only ever grows by ADD; nothing sets or removes it.
		UpdateExpression: aws.String("SET #h = :h, #s = :s, #ttl = :ttl, #since = :since ADD #tok :delta"),
		ExpressionAttributeNames: map[string]string{
			"#h": attrHolder, "#s": attrSession, "#ttl": attrTTL, "#since": attrSince, "#tok": attrToken,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":h":     str(id),
			":s":     str(s.ID),
			":ttl":   num(b.ttlMS()),
			":since": num(time.Now().UnixMilli()),
			":delta": numU(token - r.token),
		},
	}
	if r.exists {
		// Every acquisition moves the token, so the token read makes
		// this a compare-and-swap of the whole lease.
		in.ConditionExpression = aws.String("#tok = :read")
		in.ExpressionAttributeValues[":read"] = numU(r.token)
	} else {
		in.ConditionExpression = aws.String("attribute_not_exists(#tok)")
	}
	rctx, cancel := b.reqCtx(ctx)
	_, err := b.db.UpdateItem(rctx, in)
	cancel()
	if err != nil {
		// The condition failed, or the reply was lost. Either way the
		// write may be ours (the SDK retries a request whose reply it
		// lost, and the retry's condition then fails on our own write):
		// the item says.
		landed, rerr := b.landed(ctx, name, id, s.ID, token)
		switch {
		case rerr == nil && landed:
			b.o.log.Info("acquisition's reply was lost, but it landed: adopting the term", "lease", name, "token", token, "err", err)
		case rerr == nil && conditionFailed(err):
			return nil, nil
		default:
			// It may land yet: free whatever our session holds of name,
			// while our slot keeps the name claimed.
			b.sessions.CleanClaimed(sl, func() { b.dropLeftover(s, name, id) })
			return nil, b.campaignErr(ctx, s, name, "acquire lease", err)
		}
	}
	if prev, e := b.epochs.Saw(name, token>>32), token>>32; prev != 0 && e != prev {
		b.o.log.Warn("the lease's token epoch changed: the table lost the lease's item and it was created anew",
			"lease", name, "old_epoch", backend.FormatEpoch(prev), "new_epoch", backend.FormatEpoch(e), "token", token)
	}
	t := &term{b: b, s: s, name: name}
	bt, err := b.sessions.Start(s, sl, name, token, t.release, backend.StartOptions{Watch: func() {}})
	if err != nil {
		b.sessions.CleanClaimed(sl, func() { b.dropLeftover(s, name, id) })
		return nil, err
	}
	t.BasicTerm = bt
	b.held.Store(name, t)
	b.o.log.Debug("acquired", "lease", name, "token", token, "session", s.ID)
	return t, nil
}

// sessionExists reports whether session s's item exists and is not dead,
// before a lease's item is created: a missing lease item may mean that the
// table lost its data, and our session item with it, and a lease taken on
// a lost session would end at its next renewal. A check sent after
// readAt (when the caller read the lease item) answers for it too, so that
// a burst of new leases costs one read, not one each.
func (b *Backend) sessionExists(ctx context.Context, s *backend.Session[string], readAt time.Time) (bool, error) {
	b.checkMu.Lock()
	reuse := b.checked.session == s.ID && b.checked.sent.After(readAt)
	b.checkMu.Unlock()
	if reuse {
		return true, nil
	}
	sent := time.Now()
	sess, err := b.readSession(ctx, s.ID)
	if err != nil {
		return false, err
	}
	if sess.dead || sess.renewals < 0 {
		return false, nil
	}
	b.checkMu.Lock()
	if sent.After(b.checked.sent) || b.checked.session != s.ID {
		b.checked.session, b.checked.sent = s.ID, sent
	}
	b.checkMu.Unlock()
	return true, nil
}

// landed reads lease name back and reports whether it names candidate id
// on session, with token: an acquisition whose reply was lost landed.
func (b *Backend) landed(ctx context.Context, name, id, session string, token uint64) (bool, error) {
	r, err := b.read(ctx, name)
	if err != nil {
		return false, err
	}
	return r.exists && r.holder == id && r.session == session && r.token == token, nil
}

// killSession marks session id dead if its renewal count is still
// renewals, and reports whether it is now dead (or gone).
func (b *Backend) killSession(ctx context.Context, id string, renewals int64) (bool, error) {
	rctx, cancel := b.reqCtx(ctx)
	defer cancel()
	_, err := b.db.UpdateItem(rctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(b.o.Table),
		Key:                       sessionKey(id),
		UpdateExpression:          aws.String("SET #dead = :t"),
		ConditionExpression:       aws.String("#n = :n"),
		ExpressionAttributeNames:  map[string]string{"#dead": attrDead, "#n": attrRenewals},
		ExpressionAttributeValues: map[string]types.AttributeValue{":t": &types.AttributeValueMemberBOOL{Value: true}, ":n": num(renewals)},
	})
	if err == nil {
		return true, nil
	}
	if !conditionFailed(err) {
		return false, err
	}
	// Renewed meanwhile, or already dead or gone; a retry of our own
	// request, whose first reply was lost, reads as dead.
	sess, err := b.readSession(ctx, id)
	if err != nil {
		return false, err
	}
	return sess.dead || sess.renewals < 0, nil
}

// dropLeftover frees lease name if session s holds it for candidate id, in
// the background after a failed acquisition or start.
func (b *Backend) dropLeftover(s *backend.Session[string], name, id string) {
	backend.Retry(b.sessions.Context(), b.o.cfg.RenewInterval/4, b.o.cfg.RenewInterval, true, func(ctx context.Context) error {
		_, err := b.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(b.o.Table),
			Key:                       leaseKey(name),
			UpdateExpression:          aws.String("REMOVE #h, #s, #since"),
			ConditionExpression:       aws.String("#s = :s AND #h = :h"),
			ExpressionAttributeNames:  map[string]string{"#h": attrHolder, "#s": attrSession, "#since": attrSince},
			ExpressionAttributeValues: map[string]types.AttributeValue{":s": str(s.ID), ":h": str(id)},
		})
		if conditionFailed(err) {
			return nil
		}
		return err
	})
}

// Leader implements baton.Backend. It reports what the lease's item says,
// which may name a holder that died, until a campaigning contender has seen
// its session unrenewed for a TTL; a lease whose holder's session item is
// marked dead names its holder still: a contender marked it on its way
// to taking the lease over, which it does next. A session item that is gone (deleted by
// DynamoDB's Time to Live an hour after its last renewal, or by hand) is
// taken for live, as campaigns time it.
func (b *Backend) Leader(ctx context.Context, name string) (baton.Record, error) {
	r, err := b.read(ctx, name)
	if err != nil {
		if reason := configProblem(err); reason != "" && !tableMissing(err) {
			return baton.Record{}, &TableError{Table: b.o.Table, Reason: reason, Err: err}
		}
		return baton.Record{}, backend.Unavailable(ctx, "dynamodb: read lease "+name, err)
	}
	return r.record(name)
}

// record is what Leader says of lease name whose item is r.
func (r leaseItem) record(name string) (baton.Record, error) {
	if !r.exists || r.holder == "" || r.session == "" {
		return baton.Record{}, fmt.Errorf("%w for lease %q", baton.ErrNoLeader, name)
	}
	return baton.Record{Lease: name, Holder: r.holder, Token: r.token, Since: r.since}, nil
}

// releaseItem frees lease name if token's term on session still holds it.
func (b *Backend) releaseItem(ctx context.Context, name string, token uint64, session string) error {
	rctx, cancel := b.reqCtx(ctx)
	defer cancel()
	_, err := b.db.UpdateItem(rctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(b.o.Table),
		Key:                       leaseKey(name),
		UpdateExpression:          aws.String("REMOVE #h, #s, #since"),
		ConditionExpression:       aws.String("#tok = :tok AND #s = :s"),
		ExpressionAttributeNames:  map[string]string{"#h": attrHolder, "#s": attrSession, "#since": attrSince, "#tok": attrToken},
		ExpressionAttributeValues: map[string]types.AttributeValue{":tok": numU(token), ":s": str(session)},
	})
	if err != nil && !conditionFailed(err) {
		return fmt.Errorf("dynamodb: release lease %q (it frees itself a TTL after the session's last renewal): %w", name, err)
	}
	return nil
}

// term is a term of a lease on this Backend's session.
type term struct {
	*backend.BasicTerm
	b    *Backend
	s    *backend.Session[string]
	name string
}

// release frees the lease if this term still holds it.
func (t *term) release(ctx context.Context) error {
	err := t.b.releaseItem(ctx, t.name, t.Token(), t.s.ID)
	if err == nil {
		t.b.held.CompareAndDelete(t.name, t)
	}
	return err
}

// LoadState implements baton.StateTerm: one strongly consistent GetItem.
func (t *term) LoadState(ctx context.Context) ([]byte, error) {
	rctx, cancel := t.b.reqCtx(ctx)
	defer cancel()
	out, err := t.b.db.GetItem(rctx, &dynamodb.GetItemInput{
		TableName: aws.String(t.b.o.Table), Key: leaseKey(t.name), ConsistentRead: aws.Bool(true),
		ProjectionExpression: aws.String("#st"), ExpressionAttributeNames: map[string]string{"#st": attrState},
	})
	if err != nil {
		return nil, backend.Unavailable(ctx, "dynamodb: load state of lease "+t.name, err)
	}
	return decodeState(out.Item[attrState]), nil
}

// StoreState implements baton.StateTerm: one UpdateItem on the condition
// that the lease's item still names this term's token and session.
func (t *term) StoreState(ctx context.Context, value []byte) error {
	return backend.StoreState(ctx, t, value, func(ctx context.Context, value []byte) error {
		sctx, cancel := context.WithDeadline(ctx, t.SafeUntil())
		defer cancel()
		_, err := t.b.db.UpdateItem(sctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(t.b.o.Table),
			Key:                       leaseKey(t.name),
			UpdateExpression:          aws.String("SET #st = :v"),
			ConditionExpression:       aws.String("#tok = :tok AND #s = :s AND attribute_exists(#h)"),
			ExpressionAttributeNames:  map[string]string{"#st": attrState, "#tok": attrToken, "#s": attrSession, "#h": attrHolder},
			ExpressionAttributeValues: map[string]types.AttributeValue{":v": &types.AttributeValueMemberB{Value: encodeState(value)}, ":tok": numU(t.Token()), ":s": str(t.s.ID)},
		})
		if conditionFailed(err) {
			err := fmt.Errorf("%w: lease %q is no longer held by token %d", baton.ErrLeaseLost, t.name, t.Token())
			t.End(err)
			return err
		}
		if err != nil {
			if e := t.Err(); e != nil {
				return backend.EndedError(t)
			}
			return backend.Unavailable(ctx, "dynamodb: store state of lease "+t.name, err)
		}
		return nil
	})
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ttlMS is the TTL in whole milliseconds, rounded up: contenders wait at
// least that long, never less than the TTL.
func (b *Backend) ttlMS() int64 {
	return int64((b.o.cfg.TTL + time.Millisecond - 1) / time.Millisecond)
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }
func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
func numU(n uint64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatUint(n, 10)}
}

func conditionFailed(err error) bool {
	var cf *types.ConditionalCheckFailedException
	return errors.As(err, &cf)
}
