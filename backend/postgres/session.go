package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton/backend"
)

// errSessionGone is Renew's error when the session row is gone: a
// contender took it over after seeing it unrenewed for a TTL, an operator
// deleted it, or the database lost its data.
var errSessionGone = errors.New("postgres: the session row is gone")

// driver is the Backend's backend.SessionDriver: a row of the sessions
// table per session.
type driver struct{ b *Backend }

var _ backend.SessionDriver[string] = driver{}

// Grant implements backend.SessionDriver: one INSERT.
func (d driver) Grant(ctx context.Context) (backend.SessionGrant[string], error) {
	b := d.b
	id := randomID()
	for tries := 0; ; tries++ {
		start := time.Now()
		_, err := b.exec(ctx, b.q.grant, id, b.o.Owner, b.ttlMS())
		if err == nil {
			return backend.SessionGrant[string]{
				ID: id, SafeUntil: b.o.cfg.SafeUntil(start, b.o.cfg.TTL), TTL: b.o.cfg.TTL,
				Span: b.o.cfg.TTL - b.o.cfg.DriftMargin,
			}, nil
		}
		if tries == 0 && missingObject(err) && !b.o.NoCreate {
			// The database lost baton's schema (a restore, a new cluster
			// behind the same address): make it again.
			if err := b.ensureSchema(ctx); err != nil {
				return backend.SessionGrant[string]{}, err
			}
			continue
		}
		return backend.SessionGrant[string]{}, b.safeErr(err)
	}
}

// Renew implements backend.SessionDriver: one UPDATE of the session row,
// whatever the number of leases riding on it.
func (d driver) Renew(ctx context.Context, id string) (time.Time, error) {
	b := d.b
	start := time.Now()
	tag, err := b.renewExec(ctx, b.q.renew, id)
	if err != nil {
		if missingObject(err) {
			return time.Time{}, fmt.Errorf("%w: %w", errSessionGone, b.safeErr(err))
		}
		return time.Time{}, b.safeErr(err)
	}
	if tag.RowsAffected() == 0 {
		return time.Time{}, errSessionGone
	}
	return b.o.cfg.SafeUntil(start, b.o.cfg.TTL), nil
}

// Revoke implements backend.SessionDriver: deletes the session row and
// frees its leases, notifying their waiters, in one statement.
func (d driver) Revoke(ctx context.Context, id string, _ bool) error {
	b := d.b
	if _, err := b.exec(ctx, b.q.revoke, id, b.q.channel); err != nil && !missingObject(err) {
		return fmt.Errorf("postgres: delete session %s (its leases free themselves a TTL after its last renewal): %w", id, b.safeErr(err))
	}
	return nil
}

// Gone implements backend.SessionDriver.
func (driver) Gone(err error) bool { return errors.Is(err, errSessionGone) }
