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

// txn runs ops as one transaction, through Raw rather than api.Txn, whose
// errors other than a failed transaction are untyped: a 403 must be told
// apart. ok is false when Consul refused the transaction (409), and then
// resp.Errors says which ops failed. An ACL refusal, of the request or of
// an op (Consul reports those as text only, and recognises them by the
// same words: acl.IsErrPermissionDenied), wraps ErrPermissionDenied.
func (b *Backend) txn(ctx context.Context, ops api.TxnOps) (resp api.TxnResponse, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
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
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
	info, _, err := b.client.Session().Info(id, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil || info == nil {
		return 0
	}
	return info.LockDelay
}

// get reads key with a consistent read.
func (b *Backend) get(ctx context.Context, key string) (*api.KVPair, error) {
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
	p, _, err := b.kv.Get(key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	return p, permissionErr(err)
}

// deleteCAS deletes key if its ModifyIndex is index, and returns
// errCASFailed if it is not.
func (b *Backend) deleteCAS(ctx context.Context, key string, index uint64) error {
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
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
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
	info, _, err := b.client.Session().Info(id, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil || info == nil {
		return "consul session " + id
	}
	return fmt.Sprintf("%s (consul session %s on node %s)", info.Name, id, info.Node)
}
