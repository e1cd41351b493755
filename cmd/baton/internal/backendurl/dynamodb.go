package backendurl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/dynamodb"
)

// dynamoRetry is the pause between attempts to reach DynamoDB when Open
// finds it unavailable.
const dynamoRetry = time.Second

// parseDynamoURL checks a dynamodb://TABLE URL (dynamodb.ParseURL) without
// connecting. It names no hosts: the endpoint is the SDK's to resolve.
func parseDynamoURL(raw string) (opener, []string, error) {
	u, err := dynamodb.ParseURL(raw)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, o Options) (*Backend, error) { return openDynamo(ctx, u, o) }, nil, nil
}

// dynamoLease rejects a lease name longer than the item key allows.
func dynamoLease(name string) error {
	if len(name) > dynamodb.MaxNameLen {
		return fmt.Errorf("%d bytes is longer than %d, the longest lease name DynamoDB's item key takes", len(name), dynamodb.MaxNameLen)
	}
	return nil
}

// openDynamo opens the Backend of u: the SDK's client, then dynamodb.New,
// retried while DynamoDB is unavailable; a missing table, a denied access
// or a missing region is a *SettingsError (exit 2).
func openDynamo(ctx context.Context, u dynamodb.URL, o Options) (*Backend, error) {
	client, err := u.Client(ctx)
	if err != nil {
		return nil, &SettingsError{Err: err}
	}
	opts := dynamodb.Options{Config: backend.Config{TTL: o.TTL}, Table: u.Table, PollInterval: u.Poll, Logger: o.Logger}
	for attempt := 1; ; attempt++ {
		b, err := dynamodb.New(ctx, client, opts)
		if err == nil {
			return &Backend{Backend: b, close: b.Close}, nil
		}
		if errors.As(err, new(*baton.ConfigError)) {
			return nil, &SettingsError{Err: err}
		}
		if o.Logger != nil {
			o.Logger.Warn("DynamoDB not reachable yet; retrying", "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(dynamoRetry):
		}
	}
}
