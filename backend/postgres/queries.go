package postgres

import "strings"

// queries are the statements of one schema.
type queries struct {
	channel, probe string

	exists                           string
	grant, renew, revoke             string
	read, insert, takeFree, takeOver string
	readMany                         string
	release, dropSession             string
	loadState, storeState            string
	sessionExists                    string
}

func newQueries(schema string) queries {
	r := strings.NewReplacer("@", schema)
	return queries{
		channel: Channel(schema),
		probe:   schema + "_probe",
		exists: r.Replace(`SELECT to_regclass('@.sessions') IS NOT NULL AND to_regclass('@.leases') IS NOT NULL
			AND to_regprocedure('@.fence(text,bigint)') IS NOT NULL`),
		grant: r.Replace(`INSERT INTO @.sessions (id, owner, ttl_ms) VALUES ($1, $2, $3)`),
		// The one statement per process per renew interval.
		renew: r.Replace(`UPDATE @.sessions SET renewals = renewals + 1, renewed_at = now() WHERE id = $1`),
		revoke: r.Replace(`WITH gone AS (DELETE FROM @.sessions WHERE id = $1)
			UPDATE @.leases SET holder = NULL, session = NULL, since = NULL WHERE session = $1
			RETURNING pg_notify($2, name)`),
		read: r.Replace(`SELECT l.holder, l.session, l.token, l.ttl_ms, s.renewals, s.ttl_ms, l.since
			FROM @.leases l LEFT JOIN @.sessions s ON s.id = l.session WHERE l.name = $1`),
		// read for many leases: the one statement per poll interval that
		// reads the rows of a process's waiters as they come due.
		readMany: r.Replace(`SELECT l.name, l.holder, l.session, l.token, l.ttl_ms, s.renewals, s.ttl_ms, l.since
			FROM @.leases l LEFT JOIN @.sessions s ON s.id = l.session WHERE l.name = ANY($1)`),
		// $1 name, $2 holder, $3 our session, $4 new token, $5 ttl_ms,
		// $6 channel. Only while our session row exists: a session that a
		// contender deleted must not take leases.
		insert: r.Replace(`INSERT INTO @.leases (name, holder, session, token, ttl_ms, since)
			SELECT $1, $2, $3, $4, $5, now() WHERE EXISTS (SELECT 1 FROM @.sessions WHERE id = $3)
			ON CONFLICT (name) DO NOTHING
			RETURNING pg_notify($6, name)`),
		// $6 the token read, $7 channel. The token compare makes it a
		// compare-and-swap: every acquisition moves the token.
		takeFree: r.Replace(`UPDATE @.leases l SET holder = $2, session = $3, token = $4, ttl_ms = $5, since = now()
			WHERE l.name = $1 AND l.token = $6
			  AND (l.holder IS NULL OR l.session IS NULL OR l.session = $3
			       OR NOT EXISTS (SELECT 1 FROM @.sessions x WHERE x.id = l.session))
			  AND EXISTS (SELECT 1 FROM @.sessions y WHERE y.id = $3)
			RETURNING pg_notify($7, l.name)`),
		// $8 the dead session, $9 the renewal count seen unchanged for a
		// TTL. Deleting the session row only at that count conflicts with
		// its renewal (an UPDATE of the same row): whichever commits
		// first wins, so a renewal either lands before the takeover (and
		// the takeover does nothing) or finds its session gone. The
		// session's other leases are freed, and their waiters notified.
		takeOver: r.Replace(`WITH dead AS (DELETE FROM @.sessions WHERE id = $8 AND renewals = $9 RETURNING id),
			freed AS (UPDATE @.leases SET holder = NULL, session = NULL, since = NULL
			          WHERE session IN (SELECT id FROM dead) AND name <> $1 RETURNING pg_notify($7, name))
			UPDATE @.leases l SET holder = $2, session = $3, token = $4, ttl_ms = $5, since = now()
			WHERE l.name = $1 AND l.token = $6 AND l.session IN (SELECT id FROM dead)
			  AND EXISTS (SELECT 1 FROM @.sessions y WHERE y.id = $3)
			RETURNING pg_notify($7, l.name)`),
		release: r.Replace(`UPDATE @.leases SET holder = NULL, session = NULL, since = NULL
			WHERE name = $1 AND token = $2 AND session = $3
			RETURNING pg_notify($4, name)`),
		dropSession: r.Replace(`UPDATE @.leases SET holder = NULL, session = NULL, since = NULL
			WHERE name = $1 AND session = $2
			RETURNING pg_notify($3, name)`),
		sessionExists: r.Replace(`SELECT count(*)::int FROM @.sessions WHERE id = $1`),
		loadState:     r.Replace(`SELECT state FROM @.leases WHERE name = $1`),
		storeState:    r.Replace(`UPDATE @.leases SET state = $4 WHERE name = $1 AND token = $2 AND session = $3 AND holder IS NOT NULL`),
	}
}
