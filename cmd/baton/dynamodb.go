package main

import (
	"context"
	"fmt"
	"time"

	"github.com/batonhq/baton/backend/dynamodb"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

const dynamoLong = `Work with baton's DynamoDB table: create it, or print the IAM policy of a
role that runs baton on it. docs/backends/dynamodb.md has the same table as
CloudFormation and Terraform.`

const dynamoCreateLong = `Create baton's table (on-demand billing, string partition key "pk", Time to
Live on "expires"), and wait until it is ACTIVE. A table that already exists
with baton's key is left as it is. Region, credentials and endpoint come
from the URL's parameters and the SDK's usual resolution (AWS_REGION,
AWS_PROFILE, the instance role, AWS_ENDPOINT_URL_DYNAMODB).

  baton dynamodb create-table --backend 'dynamodb://baton-leases?region=eu-west-1'

The creating role needs dynamodb:CreateTable, DescribeTable and
UpdateTimeToLive; the role that runs baton needs only the policy of
'baton dynamodb policy'.

Exit statuses:
  0  the table exists and is ACTIVE
  1  DynamoDB could not be reached, or did not make the table ACTIVE within --timeout
  2  usage error, a region missing, access denied, or a table of that name with another key
`

const dynamoPolicyLong = `Print the least-privilege IAM policy (JSON) for a role that runs baton on the
table, for the given lease names (each a name or a pattern with * and ?):
DescribeTable; GetItem and UpdateItem on those leases' items and on session
items; PutItem on session items only; all limited by dynamodb:LeadingKeys.
No DeleteItem: baton never deletes an item. It connects to nothing.

  baton dynamodb policy --table-arn arn:aws:dynamodb:eu-west-1:123456789012:table/baton-leases --lease 'billing-*'

Exit statuses:
  0  printed
  2  usage error
`

// dynamoCreateCommand is `baton dynamodb create-table`.
type dynamoCreateCommand struct {
	app     *App
	url     string
	timeout time.Duration
	fs      *pflag.FlagSet
}

// dynamoPolicyCommand is `baton dynamodb policy`.
type dynamoPolicyCommand struct {
	app    *App
	arn    string
	leases []string
}

func (a *App) newDynamoCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dynamodb",
		Short: "DynamoDB backend: create baton's table, print the IAM policy",
		Long:  dynamoLong,
		Args:  noArgs,
	}
	c := &dynamoCreateCommand{app: a}
	cc := &cobra.Command{
		Use:   "create-table --backend dynamodb://TABLE[?region=R&endpoint=URL]",
		Short: "Create baton's table and wait until it is ACTIVE",
		Long:  dynamoCreateLong,
		Args:  noArgs,
		RunE:  wrapRunE(func(cmd *cobra.Command, _ []string) error { return c.Run(cmd.Context()) }),
	}
	c.fs = cc.Flags()
	c.fs.StringVar(&c.url, "backend", "", "the table's URL: "+dynamodb.URLForm+" (required)")
	c.fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "how long to wait for the table to be ACTIVE")
	withEnv(c.fs, "backend")
	p := &dynamoPolicyCommand{app: a}
	pc := &cobra.Command{
		Use:   "policy --table-arn ARN --lease NAME [--lease NAME...]",
		Short: "Print the least-privilege IAM policy for a role that runs baton",
		Long:  dynamoPolicyLong,
		Args:  noArgs,
		RunE:  wrapRunE(func(cmd *cobra.Command, _ []string) error { return p.Run(cmd.Context()) }),
	}
	pc.Flags().StringVar(&p.arn, "table-arn", "", "the table's ARN: arn:aws:dynamodb:REGION:ACCOUNT:table/TABLE (required)")
	pc.Flags().StringArrayVar(&p.leases, "lease", nil, "a lease name or pattern (app-*) the role may hold; repeat for more (required)")
	cmd.AddCommand(cc, pc)
	return cmd
}

// Run creates the table.
func (c *dynamoCreateCommand) Run(ctx context.Context) error {
	if c.url == "" {
		return usageErrorf("--backend is required: %s", dynamodb.URLForm)
	}
	if c.timeout <= 0 {
		return usageErrorf("--timeout %s: want a positive duration", c.timeout)
	}
	u, err := dynamodb.ParseURL(c.url)
	if err != nil {
		return usageErrorf("--backend: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	client, err := u.Client(ctx)
	if err != nil {
		return err
	}
	if err := dynamodb.CreateTable(ctx, client, u.Table); err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.app.stdout(), "table %s is ACTIVE\n", u.Table)
	return err
}

// Run prints the policy.
func (p *dynamoPolicyCommand) Run(_ context.Context) error {
	doc, err := dynamodb.Policy(p.arn, p.leases)
	if err != nil {
		return usageErrorf("%v", err)
	}
	_, err = fmt.Fprint(p.app.stdout(), doc)
	return err
}
