package etcd

import (
	"context"
	"errors"
	"fmt"

	"github.com/batonhq/baton"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var _ baton.LeadersReader = (*Backend)(nil)

// leadersPerTxn is how many leases one transaction of Leaders reads at
// most: two reads each, etcd's default limit of 128 operations per
// transaction (--max-txn-ops).
const leadersPerTxn = 64

// Leaders implements baton.LeadersReader. It makes the reads Leader makes
// for each name (its election's oldest key and its epoch key), for up to
// 64 names in one transaction: one request per 64 leases, each answered at
// one revision; fewer on a server that refuses that many operations in a
// transaction (a lower --max-txn-ops). A name Leader would refuse gets
// Leader's error.
func (b *Backend) Leaders(ctx context.Context, names []string) ([]baton.Record, []error) {
	recs, errs := make([]baton.Record, len(names)), make([]error, len(names))
	var todo []int
	for i, name := range names {
		if errs[i] = checkName(name); errs[i] == nil {
			todo = append(todo, i)
		}
	}
	for len(todo) > 0 {
		per := int(b.txnLeases.Load())
		if per == 0 {
			per = leadersPerTxn
		}
		n := min(per, len(todo))
		chunk := todo[:n]
		var err error
		if b.sessions.Closed() {
			err = baton.ErrClosed
		} else {
			ops := make([]clientv3.Op, 0, 2*n)
			for _, i := range chunk {
				ops = append(ops, clientv3.OpGet(b.prefix+names[i]+"/", clientv3.WithFirstCreate()...), clientv3.OpGet(b.epochKey(names[i])))
			}
			var resp *clientv3.TxnResponse
			resp, err = b.client.Txn(ctx).Then(ops...).Commit()
			if errors.Is(err, rpctypes.ErrTooManyOps) && n > 1 {
				b.txnLeases.Store(int64(n / 2))
				continue
			}
			if err == nil {
				for k, i := range chunk {
					recs[i], errs[i] = b.recordOf(names[i], resp.Responses[2*k].GetResponseRange().Kvs, resp.Responses[2*k+1].GetResponseRange().Kvs)
				}
			} else {
				err = b.unavailable(ctx, fmt.Sprintf("read %d elections under %q", n, b.prefix), err)
			}
		}
		if err != nil {
			for _, i := range chunk {
				errs[i] = err
			}
		}
		todo = todo[n:]
	}
	return recs, errs
}
