#!/bin/sh
# A `baton run` child that writes to PostgreSQL only while its term is the
# lease's current one: baton.fence in the same transaction as the write.
# baton sets BATON_LEASE and BATON_TOKEN; DATABASE_URL is the job's own.
# psql exits 3 (ON_ERROR_STOP) and nothing commits if a later term exists.
set -eu
exec psql "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 \
	-v lease="$BATON_LEASE" -v token="$BATON_TOKEN" -v note="${NOTE:-}" <<'SQL'
BEGIN;
SELECT baton.fence(:'lease', :token);
INSERT INTO report_runs (lease, token, note) VALUES (:'lease', :token, :'note');
COMMIT;
SQL
