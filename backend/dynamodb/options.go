package dynamodb

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// Options configures a Backend. The zero value means the documented
// defaults.
type Options struct {
	// Config holds TTL, RenewInterval and DriftMargin (defaults: 10 s,
	// TTL/3, TTL/10). The process's session item is renewed every
	// RenewInterval: one UpdateItem however many leases it holds.
	backend.Config

	// Table is the DynamoDB table's name. It must not be empty.
	Table string

	// PollInterval is how often a waiting candidate reads its lease (and
	// the holder's session item): DynamoDB pushes no change cheaply, so a
	// waiter learns of a release at its next poll, and of a dead holder
	// a TTL after it last saw a renewal, plus up to one poll. Each poll
	// costs two strongly consistent reads (2 read request units). Zero
	// means RenewInterval (3.33 s with the default TTL: 2,160 read
	// request units per waiting candidate per hour; docs/backends/dynamodb.md
	// has the cost table).
	PollInterval time.Duration

	// MaxRequests is how many requests other than the session's renewals
	// the Backend has in flight at most; the others wait their turn, so
	// that a burst of campaigns cannot delay a renewal past its deadline.
	// Zero means 4.
	MaxRequests int

	// NoCheck skips New's DescribeTable, for a role without
	// dynamodb:DescribeTable; a missing table then shows as unavailable
	// campaigns rather than New's *TableError.
	NoCheck bool

	// Owner names this process in its session item, for humans. Empty
	// means "HOSTNAME/PID".
	Owner string

	// Logger receives log lines (group "dynamodb"). Nil means silent.
	Logger *slog.Logger
}

// options are Options with the defaults filled in.
type options struct {
	Options
	cfg         backend.Config
	poll        time.Duration
	maxRequests int
	log         *slog.Logger
}

// withDefaults fills in o's defaults, or returns a *baton.ConfigError naming
// every invalid field.
func (o Options) withDefaults() (options, error) {
	var problems []string
	cfg, err := o.Config.WithDefaults()
	if err != nil {
		if ce, ok := err.(*baton.ConfigError); ok {
			problems = append(problems, ce.Problems...)
		} else {
			problems = append(problems, err.Error())
		}
	}
	if err := CheckTableName(o.Table); err != nil {
		problems = append(problems, "Table: "+err.Error())
	}
	if o.PollInterval < 0 {
		problems = append(problems, fmt.Sprintf("PollInterval (%s) must be positive, or zero for RenewInterval", o.PollInterval))
	}
	if o.MaxRequests < 0 {
		problems = append(problems, fmt.Sprintf("MaxRequests (%d) must be positive, or zero for 4", o.MaxRequests))
	}
	if len(problems) > 0 {
		return options{}, &baton.ConfigError{Problems: problems}
	}
	poll := o.PollInterval
	if poll == 0 {
		poll = cfg.RenewInterval
	}
	if o.Owner == "" {
		host, _ := os.Hostname()
		o.Owner = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	maxRequests := o.MaxRequests
	if maxRequests == 0 {
		maxRequests = 4
	}
	return options{Options: o, cfg: cfg, poll: poll, maxRequests: maxRequests, log: log.WithGroup("dynamodb")}, nil
}

// CheckTableName returns an error unless name is a valid DynamoDB table
// name: 3 to 255 characters of a-z, A-Z, 0-9, '_', '-' and '.'.
func CheckTableName(name string) error {
	if len(name) < 3 || len(name) > 255 {
		return fmt.Errorf("table name %q must be 3 to 255 characters long", name)
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-', r == '.':
		default:
			return fmt.Errorf("table name %q may hold only a-z, A-Z, 0-9, '_', '-' and '.', not %q", name, r)
		}
	}
	return nil
}
