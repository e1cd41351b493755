package dynamodb

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// limited admits at most cap(ops) requests at a time through it. Every
// request of a Backend but the session's renewal and revocation goes
// through it, so that a renewal never queues behind a burst of campaigns
// (a thousand leases campaigned for at once), in the client or at the
// endpoint: a renewal queued behind them would let every term expire.
type limited struct {
	API
	ops chan struct{}
}

func (l limited) acquire(ctx context.Context) error {
	select {
	case l.ops <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l limited) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	if err := l.acquire(ctx); err != nil {
		return nil, err
	}
	defer func() { <-l.ops }()
	return l.API.GetItem(ctx, in, opts...)
}

func (l limited) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	if err := l.acquire(ctx); err != nil {
		return nil, err
	}
	defer func() { <-l.ops }()
	return l.API.PutItem(ctx, in, opts...)
}

func (l limited) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if err := l.acquire(ctx); err != nil {
		return nil, err
	}
	defer func() { <-l.ops }()
	return l.API.UpdateItem(ctx, in, opts...)
}

func (l limited) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	if err := l.acquire(ctx); err != nil {
		return nil, err
	}
	defer func() { <-l.ops }()
	return l.API.BatchGetItem(ctx, in, opts...)
}
