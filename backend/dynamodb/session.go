package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/batonhq/baton/backend"
)

// errSessionGone is Renew's error when the session item is dead or gone: a
// contender marked it after seeing it unrenewed for a TTL, an operator
// deleted it, or the table lost its data.
var errSessionGone = errors.New("dynamodb: the session item is dead or gone")

// driver is the Backend's backend.SessionDriver: an item per session.
type driver struct{ b *Backend }

var _ backend.SessionDriver[string] = driver{}

// Grant implements backend.SessionDriver: one conditional PutItem.
func (d driver) Grant(ctx context.Context) (backend.SessionGrant[string], error) {
	b := d.b
	id := randomID()
	start := time.Now()
	_, err := b.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(b.o.Table),
		Item: map[string]types.AttributeValue{
			KeyAttribute:     str(SessionPrefix + id),
			attrRenewals:     num(0),
			attrTTL:          num(b.ttlMS()),
			attrOwner:        str(b.o.Owner),
			ExpiresAttribute: num(time.Now().Add(sessionRetention).Unix()),
		},
		ConditionExpression:      aws.String("attribute_not_exists(#k)"),
		ExpressionAttributeNames: map[string]string{"#k": KeyAttribute},
	})
	// The ID is 96 random bits: an item that already has it is our own
	// put, retried by the SDK after its reply was lost.
	if err != nil && !conditionFailed(err) {
		return backend.SessionGrant[string]{}, err
	}
	return backend.SessionGrant[string]{
		ID: id, SafeUntil: b.o.cfg.SafeUntil(start, b.o.cfg.TTL), TTL: b.o.cfg.TTL,
		Span: b.o.cfg.TTL - b.o.cfg.DriftMargin,
	}, nil
}

// Renew implements backend.SessionDriver: one UpdateItem of the session
// item, whatever the number of leases riding on it. Its count only grows
// (ADD), so a renewal whose reply was lost and that is sent again counts
// twice, which no waiter minds.
func (d driver) Renew(ctx context.Context, id string) (time.Time, error) {
	b := d.b
	start := time.Now()
	_, err := b.direct.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(b.o.Table),
		Key:                       sessionKey(id),
		UpdateExpression:          aws.String("SET #exp = :exp ADD #n :one"),
		ConditionExpression:       aws.String("attribute_exists(#n) AND attribute_not_exists(#dead)"),
		ExpressionAttributeNames:  map[string]string{"#exp": ExpiresAttribute, "#n": attrRenewals, "#dead": attrDead},
		ExpressionAttributeValues: map[string]types.AttributeValue{":exp": num(start.Add(sessionRetention).Unix()), ":one": num(1)},
	})
	if conditionFailed(err) {
		return time.Time{}, fmt.Errorf("%w: %w", errSessionGone, err)
	}
	if err != nil {
		return time.Time{}, err
	}
	return b.o.cfg.SafeUntil(start, b.o.cfg.TTL), nil
}

// Revoke implements backend.SessionDriver: it marks the session item
// dead, so that waiters take its leases at their next poll, and lets
// DynamoDB's TTL delete it later.
func (d driver) Revoke(ctx context.Context, id string, _ bool) error {
	b := d.b
	_, err := b.direct.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(b.o.Table),
		Key:                       sessionKey(id),
		UpdateExpression:          aws.String("SET #dead = :t"),
		ConditionExpression:       aws.String("attribute_exists(#n)"),
		ExpressionAttributeNames:  map[string]string{"#dead": attrDead, "#n": attrRenewals},
		ExpressionAttributeValues: map[string]types.AttributeValue{":t": &types.AttributeValueMemberBOOL{Value: true}},
	})
	if err != nil && !conditionFailed(err) {
		return fmt.Errorf("dynamodb: mark session %s dead (its leases free themselves a TTL after its last renewal): %w", id, err)
	}
	return nil
}

// Gone implements backend.SessionDriver.
func (driver) Gone(err error) bool { return errors.Is(err, errSessionGone) }
