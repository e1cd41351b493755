package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// turn waits until fewer than Options.MaxRequests bounded requests are in
// flight, or ctx ends, and returns the function that ends the caller's
// turn. Every request of the Backend but its blocking queries and its
// session's create, renew and destroy takes a turn: those are few, and a
// renewal must never wait behind campaigns.
func (b *Backend) turn(ctx context.Context) (done func(), err error) {
	select {
	case b.turns <- struct{}{}:
		return func() { <-b.turns }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("consul: waiting for one of %d requests in flight to end: %w", cap(b.turns), context.Cause(ctx))
	}
}

// request bounds a request by the Backend's request timeout and waits
// for its turn (see turn); end ends both.
func (b *Backend) request(ctx context.Context) (_ context.Context, end func(), err error) {
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	done, err := b.turn(ctx)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return ctx, func() { done(); cancel() }, nil
}

// txn runs ops as one transaction, through Raw rather than api.Txn, whose
// errors other than a failed transaction are untyped: a 403 must be told
// apart. ok is false when Consul refused the transaction (409), and then
// resp.Errors says which ops failed. An ACL refusal, of the request or of
// an op (Consul reports those as text only, and recognises them by the
// same words: acl.IsErrPermissionDenied), wraps ErrPermissionDenied.
func (b *Backend) txn(ctx context.Context, ops api.TxnOps) (resp api.TxnResponse, ok bool, err error) {
	ctx, end, err := b.request(ctx)
	if err != nil {
		return resp, false, err
	}
	defer end()
	_, err = b.client.Raw().Write("/v1/txn", ops, &resp, (&api.WriteOptions{}).WithContext(ctx))
	var se api.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusConflict {
		return resp, err == nil, permissionErr(err)
	}
	resp = api.TxnResponse{}
	if jerr := json.Unmarshal([]byte(se.Body), &resp); jerr != nil {
		return resp, false, fmt.Errorf("consul: decode failed transaction: %w (%w)", jerr, err)
	}
	for _, e := range resp.Errors {
		if strings.Contains(e.What, "Permission denied") {
			return resp, false, fmt.Errorf("%w: %s", ErrPermissionDenied, e.What)
		}
	}
	return resp, false, nil
}

// lockDelayOf looks up the lock-delay of session id while it still exists,
// so that a waiter knows how long a lock it saw invalidated stays
// unavailable. It returns zero when it cannot tell.
func (b *Backend) lockDelayOf(ctx context.Context, id string) time.Duration {
	ctx, end, err := b.request(ctx)
	if err != nil {
		return 0
	}
	defer end()
	info, _, err := b.client.Session().Info(id, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil || info == nil {
		return 0
	}
	return info.LockDelay
}

// get reads key with a consistent read.
func (b *Backend) get(ctx context.Context, key string) (*api.KVPair, error) {
	ctx, end, err := b.request(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	p, _, err := b.kv.Get(key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	return p, permissionErr(err)
}

// deleteCAS deletes key if its ModifyIndex is index, and returns
// errCASFailed if it is not.
func (b *Backend) deleteCAS(ctx context.Context, key string, index uint64) error {
	ctx, end, err := b.request(ctx)
	if err != nil {
		return err
	}
	defer end()
	ok, _, err := b.kv.DeleteCAS(&api.KVPair{Key: key, ModifyIndex: index}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return permissionErr(err)
	}
	if !ok {
		return errCASFailed
	}
	return nil
}

// errCASFailed is deleteCAS's error when the key had another index.
var errCASFailed = errors.New("consul: key changed since it was read")

// describeSession names the holder of a lock that carries no candidate ID.
func (b *Backend) describeSession(ctx context.Context, id string) string {
	ctx, end, err := b.request(ctx)
	if err != nil {
		return "consul session " + id
	}
	defer end()
	info, _, err := b.client.Session().Info(id, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil || info == nil {
		return "consul session " + id
	}
	return fmt.Sprintf("%s (consul session %s on node %s)", info.Name, id, info.Node)
}
