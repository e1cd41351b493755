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
	join, leave                      string
}

// wakeHeads returns the common table expressions that wake, for each
// lease named in the CTE rel (a column name), the first process in its
// queue (@.waiters, by joined) whose session was renewed within its TTL,
// with a notification on that process's channel (WakeChannel); except,
// when except is a parameter, the process it names. The statement must
// read the CTE woken for the notifications to be sent. A process whose
// session lapsed is passed over (it is gone, or paused), and so is one
// whose LISTEN connection the server no longer has (by its
// application_name, listenerAppName): it crashed, or it is reconnecting
// and reads every lease it waits for once it listens again; a
// notification would reach nobody. A process that is gone while the
// server still has its connection (its host cut off, until TCP gives up
// on the connection) loses the wake-up, and its successor reads the lease
// when its holder would have expired.
func wakeHeads(rel, except string) string {
	cond := ""
	if except != "" {
		cond = " AND w.listener <> " + except
	}
	return `heads AS (SELECT DISTINCT ON (w.name) w.name, w.listener FROM @.waiters w JOIN @.sessions s ON s.id = w.session
			WHERE w.name IN (SELECT name FROM ` + rel + `) AND s.renewed_at > now() - s.ttl_ms * interval '1 millisecond'` + cond + `
			  AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.application_name = '` + listenerAppPrefix + `' || w.listener)
			ORDER BY w.name, w.joined),
		woken AS (SELECT pg_notify('` + wakePrefix + `' || h.listener, h.name) FROM heads h)`
}

// reservedMS is the column of the lease reads that says how many
// milliseconds the free lease stays kept for another process's woken queue
// head ($2 the reader's listener ID); 0 when it is not.
const reservedMS = `CASE WHEN l.holder IS NULL AND l.reserved_for <> $2 AND l.reserved_until > now()
			THEN ceil(extract(epoch FROM l.reserved_until - now()) * 1000)::bigint ELSE 0 END`

func newQueries(schema string) queries {
	r := strings.NewReplacer("@", schema)
	return queries{
		channel: Channel(schema),
		probe:   schema + "_probe",
		exists: r.Replace(`SELECT to_regclass('@.sessions') IS NOT NULL AND to_regclass('@.leases') IS NOT NULL AND to_regclass('@.waiters') IS NOT NULL
			AND to_regprocedure('@.fence(text,bigint)') IS NOT NULL
			AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('@.leases') AND attname = 'reserved_until' AND NOT attisdropped)`),
		grant: r.Replace(`INSERT INTO @.sessions (id, owner, ttl_ms) VALUES ($1, $2, $3)`),
		// The one statement per process per renew interval.
		renew: r.Replace(`UPDATE @.sessions SET renewals = renewals + 1, renewed_at = now() WHERE id = $1`),
		revoke: r.Replace(`WITH gone AS (DELETE FROM @.sessions WHERE id = $1),
			rel AS (UPDATE @.leases SET holder = NULL, session = NULL, since = NULL WHERE session = $1 RETURNING name),
			` + wakeHeads("rel", "") + `
			SELECT pg_notify($2, name) FROM rel, (SELECT count(*) FROM woken) x`),
		// $2 the reader's listener ID: reserved_ms is how long the free
		// lease stays kept for another process's woken queue head.
		read: r.Replace(`SELECT l.holder, l.session, l.token, l.ttl_ms, s.renewals, s.ttl_ms, l.since, ` + reservedMS + `
			FROM @.leases l LEFT JOIN @.sessions s ON s.id = l.session WHERE l.name = $1`),
		// read for many leases: the one statement per poll interval that
		// reads the rows of a process's waiters as they come due.
		readMany: r.Replace(`SELECT l.name, l.holder, l.session, l.token, l.ttl_ms, s.renewals, s.ttl_ms, l.since, ` + reservedMS + `
			FROM @.leases l LEFT JOIN @.sessions s ON s.id = l.session WHERE l.name = ANY($1)`),
		// $1 name, $2 holder, $3 our session, $4 new token, $5 ttl_ms,
		// $6 channel. Only while our session row exists: a session that a
		// contender deleted must not take leases.
		// An acquisition takes its process out of the lease's queue.
		insert: r.Replace(`WITH dq AS (DELETE FROM @.waiters WHERE name = $1 AND session = $3)
			INSERT INTO @.leases (name, holder, session, token, ttl_ms, since)
			SELECT $1, $2, $3, $4, $5, now() WHERE EXISTS (SELECT 1 FROM @.sessions WHERE id = $3)
			ON CONFLICT (name) DO NOTHING
			RETURNING pg_notify($6, name)`),
		// $6 the token read, $7 channel, $8 our listener ID. The token
		// compare makes it a compare-and-swap: every acquisition moves the
		// token. A lease a release keeps for another process's woken queue
		// head is not taken until that reservation ends; the process's
		// queue entry stays then, and it waits.
		takeFree: r.Replace(`WITH dq AS (DELETE FROM @.waiters WHERE name = $1 AND session = $3
			  AND NOT EXISTS (SELECT 1 FROM @.leases r WHERE r.name = $1 AND r.reserved_for <> $8 AND r.reserved_until > now()))
			UPDATE @.leases l SET holder = $2, session = $3, token = $4, ttl_ms = $5, since = now(), reserved_for = NULL, reserved_until = NULL
			WHERE l.name = $1 AND l.token = $6
			  AND (l.holder IS NULL OR l.session IS NULL OR l.session = $3
			       OR NOT EXISTS (SELECT 1 FROM @.sessions x WHERE x.id = l.session))
			  AND (l.reserved_for IS NULL OR l.reserved_for = $8 OR l.reserved_until <= now())
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
			          WHERE session IN (SELECT id FROM dead) AND name <> $1 RETURNING pg_notify($7, name), name),
			dq AS (DELETE FROM @.waiters WHERE name = $1 AND session = $3),
			` + wakeHeads("freed", "") + `,
			took AS (UPDATE @.leases l SET holder = $2, session = $3, token = $4, ttl_ms = $5, since = now()
			WHERE l.name = $1 AND l.token = $6 AND l.session IN (SELECT id FROM dead)
			  AND EXISTS (SELECT 1 FROM @.sessions y WHERE y.id = $3)
			RETURNING l.name)
			SELECT pg_notify($7, name) FROM took, (SELECT count(*) FROM woken) x`),
		// A release wakes the first live process in the lease's queue,
		// and keeps the free lease for it for a tenth of the TTL (at most
		// a second, by the server's clock): otherwise the releasing
		// process's own next candidate, which needs no wake-up, takes it
		// first, and a process with many candidates passes the lease
		// among its own while the queue waits.
		release: r.Replace(`WITH head AS (SELECT w.listener FROM @.waiters w JOIN @.sessions s ON s.id = w.session
			  WHERE w.name = $1 AND s.renewed_at > now() - s.ttl_ms * interval '1 millisecond'
			    AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.application_name = '` + listenerAppPrefix + `' || w.listener)
			  ORDER BY w.joined LIMIT 1),
			rel AS (UPDATE @.leases SET holder = NULL, session = NULL, since = NULL,
			    reserved_for = (SELECT listener FROM head),
			    reserved_until = now() + least(ttl_ms / 10, 1000) * interval '1 millisecond'
			  WHERE name = $1 AND token = $2 AND session = $3 RETURNING name),
			woken AS (SELECT pg_notify('` + wakePrefix + `' || h.listener, $1) FROM head h WHERE EXISTS (SELECT 1 FROM rel))
			SELECT pg_notify($4, name) FROM rel, (SELECT count(*) FROM woken) x`),
		dropSession: r.Replace(`WITH rel AS (UPDATE @.leases SET holder = NULL, session = NULL, since = NULL
			WHERE name = $1 AND session = $2 RETURNING name),
			` + wakeHeads("rel", "") + `
			SELECT pg_notify($3, name) FROM rel, (SELECT count(*) FROM woken) x`),
		// $1 name, $2 the process's listener ID, $3 its session. Once per
		// campaign (and per session): a process keeps its place. The join
		// answers the lease's token and session as they are once it is in
		// the queue: a release that committed after the waiter's read but
		// before the join found no queue entry to wake, and the waiter
		// reads again at once rather than wait for the holder's TTL. FOR
		// SHARE waits out a release in flight and answers the row it left.
		join: r.Replace(`WITH j AS (INSERT INTO @.waiters (name, listener, session) VALUES ($1, $2, $3)
			ON CONFLICT (name, listener) DO UPDATE SET session = EXCLUDED.session WHERE @.waiters.session <> EXCLUDED.session)
			SELECT l.token, l.session FROM @.leases l WHERE l.name = $1 FOR SHARE OF l`),
		// $1 name, $2 listener ID. A process that stops waiting leaves,
		// and passes on a wake-up it may have got while the lease is free.
		// A reservation kept for it ends too.
		leave: r.Replace(`WITH dq AS (DELETE FROM @.waiters WHERE name = $1 AND listener = $2),
			unreserve AS (UPDATE @.leases SET reserved_for = NULL, reserved_until = NULL WHERE name = $1 AND reserved_for = $2),
			rel AS (SELECT $1::text AS name WHERE NOT EXISTS (SELECT 1 FROM @.leases WHERE name = $1 AND holder IS NOT NULL)),
			` + wakeHeads("rel", "$2") + `
			SELECT count(*) FROM woken`),
		sessionExists: r.Replace(`SELECT count(*)::int FROM @.sessions WHERE id = $1`),
		loadState:     r.Replace(`SELECT state FROM @.leases WHERE name = $1`),
		storeState:    r.Replace(`UPDATE @.leases SET state = $4 WHERE name = $1 AND token = $2 AND session = $3 AND holder IS NOT NULL`),
	}
}
