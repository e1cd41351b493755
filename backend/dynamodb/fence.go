package dynamodb

import (
	"strconv"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Fence is what an application adds to its own UpdateItem (or PutItem's
// condition) so that the write lands only if no later term of the lease
// has written the item: the item keeps the highest token that wrote it,
// and a write with a lower one fails with ConditionalCheckFailedException.
// It is what stops a holder paused between its check and its write, which
// no lease can.
type Fence struct {
	// Condition goes into the ConditionExpression (joined with AND to the
	// application's own): attribute_not_exists(#baton_fence) OR
	// #baton_fence <= :baton_fence.
	Condition string
	// Set goes into the UpdateExpression's SET clause:
	// #baton_fence = :baton_fence.
	Set string
	// Names and Values go into ExpressionAttributeNames and
	// ExpressionAttributeValues.
	Names  map[string]string
	Values map[string]types.AttributeValue
}

// NewFence returns the Fence of a write by the term with token, kept in
// the item's attribute attr ("fence_token", say).
func NewFence(attr string, token uint64) Fence {
	return Fence{
		Condition: "attribute_not_exists(#baton_fence) OR #baton_fence <= :baton_fence",
		Set:       "#baton_fence = :baton_fence",
		Names:     map[string]string{"#baton_fence": attr},
		Values:    map[string]types.AttributeValue{":baton_fence": &types.AttributeValueMemberN{Value: strconv.FormatUint(token, 10)}},
	}
}
