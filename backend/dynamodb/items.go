package dynamodb

import (
	"context"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// The attributes of the items. A lease's item: holder, session, token,
// ttl_ms, since and state; it is never deleted, and its token only grows
// (by ADD). A session's item: renewals, ttl_ms, owner, expires, and dead
// once a contender or its own process ended it.
const (
	attrHolder   = "holder"
	attrSession  = "session"
	attrToken    = "token"
	attrTTL      = "ttl_ms"
	attrSince    = "since"
	attrState    = "state"
	attrRenewals = "renewals"
	attrOwner    = "owner"
	attrDead     = "dead"
)

func leaseKey(name string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{KeyAttribute: str(LeasePrefix + name)}
}

func sessionKey(id string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{KeyAttribute: str(SessionPrefix + id)}
}

// leaseItem is a lease's item with its holder's session item.
type leaseItem struct {
	exists  bool
	holder  string
	session string
	token   uint64
	ttlMS   int64
	since   time.Time

	readAt time.Time // when the read was sent

	renewals    int64 // -1: no session item
	sessionTTL  int64
	sessionDead bool
}

// ttl is how long a waiter must see r's session unrenewed: the longest of
// the lease's, the session's and its own TTL.
func (r leaseItem) ttl(own time.Duration) time.Duration {
	return max(own, time.Duration(r.ttlMS)*time.Millisecond, time.Duration(r.sessionTTL)*time.Millisecond)
}

// sessionItem is a session's item as read.
type sessionItem struct {
	renewals int64 // -1: no item
	ttlMS    int64
	dead     bool
}

// read returns lease name's item and its session's: two strongly
// consistent GetItems (one when the lease is free).
func (b *Backend) read(ctx context.Context, name string) (leaseItem, error) {
	rctx, cancel := b.reqCtx(ctx)
	defer cancel()
	out, err := b.db.GetItem(rctx, &dynamodb.GetItemInput{
		TableName: aws.String(b.o.Table), Key: leaseKey(name), ConsistentRead: aws.Bool(true),
		ProjectionExpression:     aws.String("#h, #s, #tok, #ttl, #since"),
		ExpressionAttributeNames: map[string]string{"#h": attrHolder, "#s": attrSession, "#tok": attrToken, "#ttl": attrTTL, "#since": attrSince},
	})
	if err != nil {
		return leaseItem{}, err
	}
	if out.Item == nil {
		return leaseItem{renewals: -1}, nil
	}
	r := b.leaseFrom(name, out.Item)
	if r.holder == "" || r.session == "" {
		return r, nil
	}
	sess, err := b.readSession(ctx, r.session)
	if err != nil {
		return leaseItem{}, err
	}
	r.renewals, r.sessionTTL, r.sessionDead = sess.renewals, sess.ttlMS, sess.dead
	return r, nil
}

// readSession reads session id's item, strongly consistent.
func (b *Backend) readSession(ctx context.Context, id string) (sessionItem, error) {
	rctx, cancel := b.reqCtx(ctx)
	defer cancel()
	out, err := b.db.GetItem(rctx, &dynamodb.GetItemInput{
		TableName: aws.String(b.o.Table), Key: sessionKey(id), ConsistentRead: aws.Bool(true),
		ProjectionExpression:     aws.String("#n, #ttl, #dead"),
		ExpressionAttributeNames: map[string]string{"#n": attrRenewals, "#ttl": attrTTL, "#dead": attrDead},
	})
	if err != nil {
		return sessionItem{}, err
	}
	if out.Item == nil {
		return sessionItem{renewals: -1}, nil
	}
	return sessionFrom(out.Item), nil
}

// encodeState prefixes the state with a version byte, so that an empty
// state is a non-empty binary, which every DynamoDB endpoint stores.
func encodeState(v []byte) []byte { return append([]byte{1}, v...) }

// decodeState returns the state that encodeState stored in av, or nil.
func decodeState(av types.AttributeValue) []byte {
	v, ok := av.(*types.AttributeValueMemberB)
	if !ok || len(v.Value) == 0 {
		return nil
	}
	return append([]byte{}, v.Value[1:]...)
}

func getS(item map[string]types.AttributeValue, k string) string {
	if v, ok := item[k].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

func getN(item map[string]types.AttributeValue, k string) int64 {
	if v, ok := item[k].(*types.AttributeValueMemberN); ok {
		n, _ := strconv.ParseInt(v.Value, 10, 64)
		return n
	}
	return 0
}

func getU(item map[string]types.AttributeValue, k string) uint64 {
	if v, ok := item[k].(*types.AttributeValueMemberN); ok {
		n, _ := strconv.ParseUint(v.Value, 10, 64)
		return n
	}
	return 0
}
