package postgres

import (
	"errors"
	"fmt"
	"strings"

	"github.com/batonhq/baton"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrFenced is wrapped by the error of a transaction that baton.fence
// refused: the token is not the lease's current term.
var ErrFenced = errors.New("postgres: fenced: a later term of the lease exists, or the term ended")

// SchemaError is New's error when baton's schema is missing or incomplete
// and New may not, or could not, create it. It matches *baton.ConfigError
// (errors.As), so the CLI exits 2; DDL holds what a DBA must apply.
type SchemaError struct {
	// Schema is the schema's name.
	Schema string
	// Reason says what is missing and why it was not created.
	Reason string
	// DDL is SchemaSQL(Schema).
	DDL string
}

// Error implements error. It names the schema and the reason, and says
// where to get the DDL; it never holds connection details.
func (e *SchemaError) Error() string {
	return fmt.Sprintf("postgres: schema %q: %s; apply the DDL of `baton postgres schema` (postgres.SchemaSQL) and its GRANTs as a role that may, then start again", e.Schema, e.Reason)
}

// Unwrap returns a *baton.ConfigError with the same message.
func (e *SchemaError) Unwrap() error {
	return &baton.ConfigError{Problems: []string{e.Error()}}
}

// FencedError is the error of a statement that baton.fence refused. It
// wraps ErrFenced and the server's *pgconn.PgError.
type FencedError struct {
	// Lease and Token are what the fence was asked for.
	Lease string
	Token uint64
	// Err is the server's error.
	Err error
}

// Error implements error.
func (e *FencedError) Error() string {
	return fmt.Sprintf("postgres: fenced: token %d of lease %q is not its current term: %v", e.Token, e.Lease, e.Err)
}

// Unwrap returns ErrFenced and the server's error.
func (e *FencedError) Unwrap() []error { return []error{ErrFenced, e.Err} }

// IsFenced reports whether err is, or wraps, a refusal by baton.fence
// (SQLSTATE BATON), whichever way the transaction reached the server.
func IsFenced(err error) bool {
	if errors.Is(err, ErrFenced) {
		return true
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == FencedSQLState
}

// sqlState returns err's SQLSTATE, or "".
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// missingObject reports whether err says that baton's schema, table or
// function does not exist (the database lost it, or nobody created it).
func missingObject(err error) bool {
	switch sqlState(err) {
	case "42P01", "3F000", "42883": // undefined_table, invalid_schema_name, undefined_function
		return true
	}
	return false
}

// redact removes password from s: pgx's errors name the host, user and
// database, never the password, but a server's message could echo a
// connection string.
func redact(s, password string) string {
	if password == "" {
		return s
	}
	return strings.ReplaceAll(s, password, "xxxxx")
}
