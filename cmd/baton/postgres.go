package main

import (
	"context"
	"fmt"
	"regexp"

	"github.com/batonhq/baton/backend/postgres"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

const postgresLong = `Work with baton's schema in a PostgreSQL database, for a DBA or a migration tool.`

const postgresSchemaLong = `Print the DDL of baton's schema (its sessions and leases tables and the
baton.fence function), then the least-privilege GRANTs for the role that
runs baton and, with --fencer, for the role of jobs that only fence their
writes. It connects to nothing. The DDL is idempotent (IF NOT EXISTS, CREATE
OR REPLACE): put it in your own migrations as it is, and apply it as a role
that may create the schema.

baton run (and cron, is-leader, leader) with --backend postgres://... creates
the schema itself when its role may; when the schema is missing and it may
not (or the URL says baton_create=false), it exits 2 and prints this DDL.

The baton role needs USAGE on the schema, SELECT, INSERT, UPDATE, DELETE on
its two tables and EXECUTE on baton.fence; no right to create or drop
anything. A fencer needs USAGE and EXECUTE on baton.fence only: the function
runs with its owner's rights (SECURITY DEFINER, fixed search_path), so a
job's role cannot move a lease.

  baton postgres schema --role app_baton --fencer app_jobs | psql "$ADMIN_URL"

Exit statuses:
  0  printed
  2  usage error (a schema or role name that is not a plain identifier)
`

// postgresSchemaCommand is `baton postgres schema`.
type postgresSchemaCommand struct {
	app    *App
	schema string
	role   string
	fencer string
	fs     *pflag.FlagSet
}

func (a *App) newPostgresCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "postgres",
		Short: "PostgreSQL backend: print baton's schema DDL and GRANTs",
		Long:  postgresLong,
		Args:  noArgs,
	}
	c := &postgresSchemaCommand{app: a}
	sc := &cobra.Command{
		Use:   "schema [--schema NAME] [--role ROLE] [--fencer ROLE]",
		Short: "Print the DDL of baton's schema and the least-privilege GRANTs",
		Long:  postgresSchemaLong,
		Args:  noArgs,
		RunE:  wrapRunE(func(cmd *cobra.Command, _ []string) error { return c.Run(cmd.Context()) }),
	}
	c.fs = sc.Flags()
	c.fs.StringVar(&c.schema, "schema", postgres.DefaultSchema, "the schema of baton's tables (the baton_schema= of the postgres:// URL)")
	c.fs.StringVar(&c.role, "role", "baton", "the role that runs baton (campaigns, renews, releases)")
	c.fs.StringVar(&c.fencer, "fencer", "", "a role whose jobs may only call baton.fence (none if empty)")
	cmd.AddCommand(sc)
	return cmd
}

// roleRE is a role name GrantSQL may print unquoted.
var roleRE = regexp.MustCompile(`^[a-z_][a-z0-9_$]{0,62}$`)

// Run prints the DDL and the GRANTs.
func (c *postgresSchemaCommand) Run(_ context.Context) error {
	var problems []string
	if err := schemaRule(c.schema); err != nil {
		problems = append(problems, fmt.Sprintf("--schema %q: %v", c.schema, err))
	}
	if !roleRE.MatchString(c.role) {
		problems = append(problems, fmt.Sprintf("--role %q: want a plain lower-case role name (letters, digits, _ and $, not starting with a digit); grant a quoted name by hand", c.role))
	}
	if c.fencer != "" && !roleRE.MatchString(c.fencer) {
		problems = append(problems, fmt.Sprintf("--fencer %q: want a plain lower-case role name (letters, digits, _ and $, not starting with a digit); grant a quoted name by hand", c.fencer))
	}
	if err := problemsError(problems); err != nil {
		return err
	}
	_, err := fmt.Fprintf(c.app.stdout(), "-- baton's schema %s (baton postgres schema)\n%s\n-- least-privilege GRANTs\n%s",
		c.schema, postgres.SchemaSQL(c.schema), postgres.GrantSQL(c.schema, c.role, c.fencer))
	return err
}

// schemaRule returns why postgres.SchemaSQL refuses schema, or nil.
func schemaRule(schema string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	postgres.SchemaSQL(schema)
	return nil
}
