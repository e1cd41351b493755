package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/batonhq/baton"
)

// The table's layout. One table holds every lease and every session, each
// an item keyed by its partition key alone, so that an IAM policy can limit
// a role to some lease names with dynamodb:LeadingKeys.
const (
	// KeyAttribute is the table's partition key, a string: LeasePrefix +
	// the lease name, or SessionPrefix + a session ID.
	KeyAttribute = "pk"
	// LeasePrefix starts the key of a lease's item.
	LeasePrefix = "lease:"
	// SessionPrefix starts the key of a process's session item.
	SessionPrefix = "session:"
	// ExpiresAttribute holds, in each session item, the Unix second after
	// which DynamoDB's Time to Live may delete it: an hour after its last
	// renewal. Lease items have none, and are never deleted.
	ExpiresAttribute = "expires"
)

// sessionRetention is how long a session item outlives its last renewal
// before DynamoDB's TTL may delete it (TTL deletes within days after that).
// A lease that still names a deleted session is timed like a live one, so
// the deletion costs a waiter one TTL at most, never safety.
const sessionRetention = time.Hour

// TableAPI is what CreateTable and New's check need of a DynamoDB client;
// *dynamodb.Client has it.
type TableAPI interface {
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

// CreateTable creates table for baton (on-demand billing, key KeyAttribute,
// Time to Live on ExpiresAttribute), waits until it is ACTIVE, within ctx,
// and returns nil if it already exists with baton's key. TTL is turned on
// where the service supports it; an emulator without it is no error.
func CreateTable(ctx context.Context, client TableAPI, table string) error {
	if err := CheckTableName(table); err != nil {
		return &baton.ConfigError{Problems: []string{"dynamodb: " + err.Error()}}
	}
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(KeyAttribute), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(KeyAttribute), KeyType: types.KeyTypeHash}},
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return tableErr(table, "create table", err)
	}
	for {
		out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if err != nil {
			return tableErr(table, "describe table", err)
		}
		if err := checkKeys(table, out.Table); err != nil {
			return err
		}
		if out.Table.TableStatus == types.TableStatusActive {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("dynamodb: table %q not ACTIVE yet (%s): %w", table, out.Table.TableStatus, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	_, err = client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName:               aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(ExpiresAttribute), Enabled: aws.Bool(true)},
	})
	if err != nil && !ttlUnsupported(err) {
		return tableErr(table, "turn on Time to Live", err)
	}
	return nil
}

// ttlUnsupported reports whether err says that Time to Live is already on,
// or that the endpoint (an emulator) does not have the operation.
func ttlUnsupported(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "UnknownOperationException", "ValidationException":
		// ValidationException: "TimeToLive is already enabled".
		return true
	}
	return false
}

// checkTable checks that table exists with baton's key.
func checkTable(ctx context.Context, client TableAPI, table string) error {
	out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	if err != nil {
		return tableErr(table, "describe table", err)
	}
	return checkKeys(table, out.Table)
}

func checkKeys(table string, d *types.TableDescription) error {
	if d == nil {
		return &TableError{Table: table, Reason: "DescribeTable returned no description"}
	}
	ok := len(d.KeySchema) == 1 && aws.ToString(d.KeySchema[0].AttributeName) == KeyAttribute && d.KeySchema[0].KeyType == types.KeyTypeHash
	for _, a := range d.AttributeDefinitions {
		if aws.ToString(a.AttributeName) == KeyAttribute && a.AttributeType != types.ScalarAttributeTypeS {
			ok = false
		}
	}
	if !ok {
		return &TableError{Table: table, Reason: fmt.Sprintf("its key is not baton's (a string partition key %q and no sort key)", KeyAttribute)}
	}
	return nil
}

// tableErr turns err, from what on table, into a *TableError when the table
// is missing or access is denied (a configuration to fix, exit 2 in the
// CLI), and otherwise an error wrapping baton.ErrBackendUnavailable.
func tableErr(table, what string, err error) error {
	if reason := configProblem(err); reason != "" {
		return &TableError{Table: table, Reason: reason, Err: err}
	}
	return fmt.Errorf("%w: dynamodb: %s %q: %w", baton.ErrBackendUnavailable, what, table, err)
}

// configProblem says what is wrong when err is one no retry fixes: the
// table is missing, access is denied, the credentials are refused.
func configProblem(err error) string {
	var nf *types.ResourceNotFoundException
	if errors.As(err, &nf) {
		return "it does not exist in this account and region: create it with `baton dynamodb create-table`, the CloudFormation or Terraform of docs/backends/dynamodb.md, or dynamodb.CreateTable"
	}
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return ""
	}
	switch ae.ErrorCode() {
	case "AccessDeniedException":
		return "access denied: give the role the policy of docs/backends/dynamodb.md (" + ae.ErrorMessage() + ")"
	case "UnrecognizedClientException", "InvalidSignatureException", "MissingAuthenticationTokenException", "ExpiredTokenException":
		return "the credentials were refused (" + ae.ErrorCode() + "): check AWS_PROFILE, AWS_ACCESS_KEY_ID or the instance role"
	}
	return ""
}

// tableMissing reports whether err says that the table does not exist.
func tableMissing(err error) bool {
	var nf *types.ResourceNotFoundException
	return errors.As(err, &nf)
}

// TableError is New's and CreateTable's error when the table is missing,
// has another key, or the role may not use it. It matches
// *baton.ConfigError (errors.As), so the CLI exits 2.
type TableError struct {
	// Table is the table's name.
	Table string
	// Reason says what is wrong and how to fix it.
	Reason string
	// Err is the service's error, if any.
	Err error
}

// Error implements error.
func (e *TableError) Error() string {
	return fmt.Sprintf("dynamodb: table %q: %s", e.Table, e.Reason)
}

// Unwrap returns a *baton.ConfigError with the same message, and Err.
func (e *TableError) Unwrap() []error {
	errs := []error{&baton.ConfigError{Problems: []string{e.Error()}}}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}
