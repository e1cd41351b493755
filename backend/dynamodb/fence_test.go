package dynamodb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/batonhq/baton/backend"
	batondynamodb "github.com/batonhq/baton/backend/dynamodb"
	"github.com/batonhq/baton/internal/testkit"
)

// TestFenceRefusesStaleTerm: a holder that lost its lease (paused past
// its term) writes with its old token after its successor wrote: the
// write is refused, and the successor's stays.
func TestFenceRefusesStaleTerm(t *testing.T) {
	d, table := startTable(t)
	c := newClient(d.Endpoint)
	b := newBackend(t, c, table, backend.Config{TTL: 2 * time.Second})
	old := testkit.CampaignWithin(t, b, "fenced", "a", 30*time.Second)
	if err := old.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	next := testkit.CampaignWithin(t, b, "fenced", "b", 30*time.Second)
	defer next.Resign(context.Background())

	write := func(token uint64, value string) error {
		f := batondynamodb.NewFence("fence_token", token)
		names := map[string]string{"#v": "value"}
		for k, v := range f.Names {
			names[k] = v
		}
		values := map[string]types.AttributeValue{":v": &types.AttributeValueMemberS{Value: value}}
		for k, v := range f.Values {
			values[k] = v
		}
		_, err := c.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
			TableName:                 aws.String(table),
			Key:                       map[string]types.AttributeValue{batondynamodb.KeyAttribute: &types.AttributeValueMemberS{Value: "app:report"}},
			UpdateExpression:          aws.String("SET #v = :v, " + f.Set),
			ConditionExpression:       aws.String(f.Condition),
			ExpressionAttributeNames:  names,
			ExpressionAttributeValues: values,
		})
		return err
	}
	if err := write(next.Token(), "new"); err != nil {
		t.Fatal(err)
	}
	err := write(old.Token(), "stale")
	var cf *types.ConditionalCheckFailedException
	if !errors.As(err, &cf) {
		t.Fatalf("write with the old term's token %d after %d: %v; want ConditionalCheckFailedException", old.Token(), next.Token(), err)
	}
	if v := item(t, c, table, "app:report")["value"].(*types.AttributeValueMemberS).Value; v != "new" {
		t.Errorf("value = %q; want the new term's", v)
	}
}
