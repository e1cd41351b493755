package dynamodb

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// maxBatchKeys is the most keys DynamoDB takes in one BatchGetItem.
const maxBatchKeys = 100

// newBatchReader returns the reader of the lease items that this Backend's
// waiters poll, and their holders' session items (backend.BatchReader):
// one strongly consistent BatchGetItem per 100 lease items that come due
// within a PollInterval, and one per 100 distinct sessions they name. A
// standby for 10,000 leases then sends 101 requests per PollInterval (100
// when the leases are free) rather than two GetItems per lease. A lease
// comes due when its waiter would have polled it itself. Read request
// units are the same as the GetItems' (one per item under 4 KB); only the
// number of requests falls. Once BatchGetItem is refused (a role whose
// policy grants GetItem alone), the reader is turned off and the waiters
// read their leases one by one, as they can with GetItem.
func newBatchReader(b *Backend) *backend.BatchReader[leaseItem] {
	var br *backend.BatchReader[leaseItem]
	var warn sync.Once
	br = backend.NewBatchReader(b.o.poll, func(ctx context.Context, names []string) (map[string]leaseItem, error) {
		items, err := b.readMany(ctx, names)
		if err != nil && configProblem(err) != "" && !tableMissing(err) {
			warn.Do(func() {
				b.o.log.Warn("BatchGetItem refused: each waiter reads its lease by itself (two GetItems per poll); allow dynamodb:BatchGetItem (dynamodb.Policy) to read 100 a request", "err", err)
			})
			br.Off()
		}
		return items, err
	})
	return br
}

// readMany reads the items of leases names and of the sessions they name,
// strongly consistent, as read does for one: a name without an item is
// absent from the map.
func (b *Backend) readMany(ctx context.Context, names []string) (map[string]leaseItem, error) {
	keys := make([]map[string]types.AttributeValue, len(names))
	for i, n := range names {
		keys[i] = leaseKey(n)
	}
	leases, err := b.batchGet(ctx, keys, "#pk, #h, #s, #tok, #ttl, #since",
		map[string]string{"#pk": KeyAttribute, "#h": attrHolder, "#s": attrSession, "#tok": attrToken, "#ttl": attrTTL, "#since": attrSince})
	if err != nil {
		return nil, err
	}
	out := make(map[string]leaseItem, len(names))
	var sessions []map[string]types.AttributeValue
	wanted := map[string]bool{}
	for _, item := range leases {
		name := getS(item, KeyAttribute)[len(LeasePrefix):]
		r := b.leaseFrom(name, item)
		out[name] = r
		if r.holder != "" && r.session != "" && !wanted[r.session] {
			wanted[r.session] = true
			sessions = append(sessions, sessionKey(r.session))
		}
	}
	if len(sessions) == 0 {
		return out, nil
	}
	items, err := b.batchGet(ctx, sessions, "#pk, #n, #ttl, #dead",
		map[string]string{"#pk": KeyAttribute, "#n": attrRenewals, "#ttl": attrTTL, "#dead": attrDead})
	if err != nil {
		return nil, err
	}
	found := make(map[string]sessionItem, len(items))
	for _, item := range items {
		found[getS(item, KeyAttribute)[len(SessionPrefix):]] = sessionFrom(item)
	}
	for name, r := range out {
		if r.holder == "" || r.session == "" {
			continue
		}
		s, ok := found[r.session]
		if !ok {
			s = sessionItem{renewals: -1}
		}
		r.renewals, r.sessionTTL, r.sessionDead = s.renewals, s.ttlMS, s.dead
		out[name] = r
	}
	return out, nil
}

// batchGet reads the items of keys, strongly consistent, maxBatchKeys a
// request, sending again the keys DynamoDB left unprocessed (throttled).
func (b *Backend) batchGet(ctx context.Context, keys []map[string]types.AttributeValue, projection string, attrs map[string]string) ([]map[string]types.AttributeValue, error) {
	var out []map[string]types.AttributeValue
	var bo backoff
	for len(keys) > 0 {
		n := min(len(keys), maxBatchKeys)
		chunk := keys[:n]
		keys = keys[n:]
		for len(chunk) > 0 {
			rctx, cancel := b.reqCtx(ctx)
			res, err := b.db.BatchGetItem(rctx, &dynamodb.BatchGetItemInput{RequestItems: map[string]types.KeysAndAttributes{
				b.o.Table: {Keys: chunk, ConsistentRead: aws.Bool(true), ProjectionExpression: aws.String(projection), ExpressionAttributeNames: attrs},
			}})
			cancel()
			if err != nil {
				return nil, err
			}
			out = append(out, res.Responses[b.o.Table]...)
			chunk = res.UnprocessedKeys[b.o.Table].Keys
			if len(chunk) > 0 {
				if err := bo.wait(ctx); err != nil {
					return nil, err
				}
			}
		}
	}
	return out, nil
}

// backoff spaces the retries of unprocessed keys, as AWS asks: 50 ms,
// doubling up to 1 s.
type backoff struct{ next time.Duration }

func (bo *backoff) wait(ctx context.Context) error {
	bo.next = min(max(2*bo.next, 50*time.Millisecond), time.Second)
	t := time.NewTimer(bo.next)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// leaseFrom is a lease's item as read, without its session.
func (b *Backend) leaseFrom(name string, item map[string]types.AttributeValue) leaseItem {
	r := leaseItem{renewals: -1, exists: true}
	r.holder = getS(item, attrHolder)
	r.session = getS(item, attrSession)
	r.token = getU(item, attrToken)
	r.ttlMS = getN(item, attrTTL)
	if ms := getN(item, attrSince); ms > 0 {
		r.since = time.UnixMilli(ms)
	}
	if r.token>>32 != 0 {
		b.epochs.Report(b.o.log, backend.EpochLocation{Store: "DynamoDB", Counter: "lease tokens", Lease: name, Kind: "item", Key: b.o.Table}, r.token>>32)
	}
	return r
}

// sessionFrom is a session's item as read.
func sessionFrom(item map[string]types.AttributeValue) sessionItem {
	dead := false
	if v, ok := item[attrDead].(*types.AttributeValueMemberBOOL); ok {
		dead = v.Value
	}
	return sessionItem{renewals: getN(item, attrRenewals), ttlMS: getN(item, attrTTL), dead: dead}
}

var _ baton.LeadersReader = (*Backend)(nil)

// Leaders implements baton.LeadersReader: what Leader says of each name,
// from one strongly consistent BatchGetItem per 100 leases (Leader's
// answer needs the lease items only). A role refused BatchGetItem gets
// Leader's answers, one GetItem each.
func (b *Backend) Leaders(ctx context.Context, names []string) ([]baton.Record, []error) {
	recs, errs := make([]baton.Record, len(names)), make([]error, len(names))
	if len(names) == 0 {
		return recs, errs
	}
	keys := make([]map[string]types.AttributeValue, len(names))
	for i, n := range names {
		keys[i] = leaseKey(n)
	}
	items, err := b.batchGet(ctx, keys, "#pk, #h, #s, #tok, #since",
		map[string]string{"#pk": KeyAttribute, "#h": attrHolder, "#s": attrSession, "#tok": attrToken, "#since": attrSince})
	if err != nil && configProblem(err) != "" && !tableMissing(err) {
		for i, name := range names {
			recs[i], errs[i] = b.Leader(ctx, name)
		}
		return recs, errs
	}
	if err != nil {
		err = backend.Unavailable(ctx, fmt.Sprintf("dynamodb: read %d leases", len(names)), err)
		for i := range errs {
			errs[i] = err
		}
		return recs, errs
	}
	found := make(map[string]leaseItem, len(items))
	for _, item := range items {
		name := getS(item, KeyAttribute)[len(LeasePrefix):]
		found[name] = b.leaseFrom(name, item)
	}
	for i, name := range names {
		recs[i], errs[i] = found[name].record(name) // absent: the zero item, nobody
	}
	return recs, errs
}
