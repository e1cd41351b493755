package redis

import (
	"context"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Tokens above 2^53 lose precision as Lua numbers, so the scripts keep
// them as the strings Redis stores and compare them as decimal strings.

// wakeHeadLua is the Lua function the release scripts share: it finds
// the first waiting process in queue q whose entry in w (ZSET of
// deadlines, server time in ms) has not lapsed and that is still
// subscribed (PUBLISH on its process channel, ARGV wake prefix + process
// ID, reaches at least one client), and either grants it the free lease
// or wakes it. Entries that fail either test are dropped: a crashed
// process's connection is closed, so PUBLISH reaches nobody, and the next
// one is tried. One message per release, whatever the number of waiting
// processes.
//
// A grant (tk, the token key, given; floor the released term's token):
// when the head's grant entry (key st:ID, Keys.Stamps) holds "STAMP
// GRANTMS HOLDER" and the token key is at least floor, the lease key is
// set to a new term of HOLDER, with the next token, expiring in GRANTMS
// (the head's choice: Backend.grantMS), and the head is sent NUL STAMP
// NUL VALUE NUL KEY. STAMP is the head's own stamp of its latest refresh of
// the entry, which the head sent before this grant: it counts the grant's
// safe-until from that send. It returns 2.
//
// A wake-up (no grant possible): key is published to the head, and the
// free lease kept for it for grace ms (its ID in key res: see
// Keys.Woken). It returns 1.
const wakeHeadLua = `
local function less(a, b) if #a ~= #b then return #a < #b end return a < b end
local function wakeHead(q, w, wake, key, nowms, res, grace, tk, st, floor)
  for i = 1, 64 do
    local h = redis.call('ZRANGE', q, 0, 0)[1]
    if not h then return 0 end
    local dl = tonumber(redis.call('ZSCORE', w, h) or '0')
    if dl >= nowms then
      local e = st and redis.call('GET', st .. ':' .. h)
      local stamp, gms, holder
      if e then stamp, gms, holder = string.match(e, '^(%d+) (%d+) (.+)$') end
      local tok = holder and floor and redis.call('GET', tk)
      if tok and not less(tok, floor) and not string.find(holder, '\0', 1, true) then
        redis.call('INCR', tk)
        tok = redis.call('GET', tk)
        local v = 'baton ' .. tok .. ' ' .. gms .. ' ' .. nowms .. ' ' .. holder
        redis.call('SET', key, v, 'PX', gms)
        if redis.call('PUBLISH', wake .. h, '\0' .. stamp .. '\0' .. v .. '\0' .. key) > 0 then
          redis.call('ZREM', q, h)
          redis.call('ZREM', w, h)
          redis.call('DEL', st .. ':' .. h)
          redis.call('DEL', res)
          return 2
        end
        redis.call('DEL', key)
      elseif redis.call('PUBLISH', wake .. h, key) > 0 then
        redis.call('SET', res, h, 'PX', grace)
        return 1
      end
    end
    redis.call('ZREM', q, h)
    redis.call('ZREM', w, h)
    if st then redis.call('DEL', st .. ':' .. h) end
  end
  return 0
end
local function servertime()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
`

// acquireScript takes a free lease. KEYS[1] the lease key, KEYS[2] the
// token key, KEYS[3] the store's marker, KEYS[4] the lease's queue of
// waiting processes, KEYS[5] their entries' deadlines, KEYS[6] the
// process a release woke (Keys.Woken), KEYS[7] the queued processes'
// grant entries' key prefix (Keys.Stamps); ARGV[1] the
// highest token this process saw for the lease ("0": none), ARGV[2] the
// first token of a new epoch (above ARGV[1]), ARGV[3] the value's tail
// ("TTLMS SINCEMS HOLDER"), ARGV[4] the TTL in milliseconds, ARGV[5] the
// channel, on which it publishes the key (for the watchers of the lease),
// ARGV[6] this process's ID ("" when it is not woken by pub/sub: it does
// not queue), ARGV[7] how long (ms) its queue entry lasts unrefreshed,
// ARGV[8] its grant entry ("STAMP GRANTMS HOLDER": see wakeHeadLua; ""
// for none).
// It returns {0, value, pttl} when the key is held, having queued the
// process (at the tail, or where it was) and refreshed its entry; {0, "",
// pttl} when it is free but kept for another process that a release woke,
// pttl being how long it is kept, having queued the process so; {2,
// created, wait} while the store is younger than a TTL by its marker
// (created is 1 when this call made the marker: the store is new, or lost
// its data); or {1, value, lost}, lost being 1 when the token key was
// missing or below ARGV[1]: the store lost writes, and the token starts a
// new epoch. A process that takes the lease leaves the queue.
//
// The marker is a key with no expiry, holding the server's time (ms) when
// baton first found it missing and the TTL (ms) of the candidate that did. A server that restarted without
// persistence (or was flushed) has lost it with the lease keys, whose
// holders may act until their safe-until, at most a TTL after their last
// renewal, which came before the loss: so no lease is granted until that
// TTL after the marker is made again.
var acquireScript = goredis.NewScript(wakeHeadLua + `
local nowms = servertime()
local function enqueue()
  if ARGV[6] ~= '' then
    redis.call('ZADD', KEYS[4], 'NX', nowms, ARGV[6])
    redis.call('ZADD', KEYS[5], nowms + tonumber(ARGV[7]), ARGV[6])
    redis.call('PEXPIRE', KEYS[4], ARGV[7])
    redis.call('PEXPIRE', KEYS[5], ARGV[7])
    if ARGV[8] ~= '' then
      redis.call('SET', KEYS[7] .. ':' .. ARGV[6], ARGV[8], 'PX', ARGV[7])
    end
  end
end
local cur = redis.call('GET', KEYS[1])
if cur then
  enqueue()
  return {0, cur, redis.call('PTTL', KEYS[1])}
end
local woken = redis.call('GET', KEYS[6])
if woken and woken ~= ARGV[6] then
  enqueue()
  return {0, '', redis.call('PTTL', KEYS[6])}
end
local made = redis.call('GET', KEYS[3])
local created = 0
if not made then
  made = string.format('%d %d', nowms, tonumber(ARGV[4]))
  redis.call('SET', KEYS[3], made)
  created = 1
end
local at, ttl = string.match(made, '^(%d+) (%d+)')
local left = 0
if at then left = tonumber(at) + tonumber(ttl) - nowms end
if left > 0 then return {2, created, left} end
local tok = redis.call('GET', KEYS[2])
local lost = 0
if (not tok) or less(tok, ARGV[1]) then
  if ARGV[1] ~= '0' then lost = 1 end
  tok = ARGV[2]
  redis.call('SET', KEYS[2], tok)
else
  redis.call('INCR', KEYS[2])
  tok = redis.call('GET', KEYS[2])
end
local v = 'baton ' .. tok .. ' ' .. ARGV[3]
redis.call('SET', KEYS[1], v, 'PX', ARGV[4])
redis.call('DEL', KEYS[6])
if ARGV[6] ~= '' then
  redis.call('ZREM', KEYS[4], ARGV[6])
  redis.call('ZREM', KEYS[5], ARGV[6])
  redis.call('DEL', KEYS[7] .. ':' .. ARGV[6])
end
redis.call('PUBLISH', ARGV[5], KEYS[1])
return {1, v, lost}
`)

// renewScript extends every lease key that still holds this process's
// value. KEYS the lease keys; ARGV[1] the TTL in milliseconds, ARGV[i+1]
// the value of KEYS[i]. It returns the indexes (1-based) of the keys that
// no longer hold their value.
var renewScript = goredis.NewScript(`
local lost = {}
for i, k in ipairs(KEYS) do
  if redis.call('GET', k) == ARGV[i + 1] then
    redis.call('PEXPIRE', k, ARGV[1])
  else
    lost[#lost + 1] = i
  end
end
return lost
`)

// releaseScript deletes every lease key that still holds its value,
// publishes its key on the channel (for the lease's watchers) and grants
// the lease to, or wakes, the first live process in the lease's queue
// (wakeHeadLua). KEYS are sextuples: the lease key, its queue, its
// queue's deadlines, its woken key, its token key, its grant entries'
// key prefix;
// ARGV[1] the channel, ARGV[2] the prefix of the process channels,
// ARGV[3] how long (ms) the lease is kept for a woken process, ARGV[i+3]
// the value of the i-th lease key. It returns how many it deleted.
var releaseScript = goredis.NewScript(wakeHeadLua + `
local n = 0
local nowms = servertime()
for i = 1, #KEYS, 6 do
  local k = KEYS[i]
  local v = ARGV[(i - 1) / 6 + 4]
  if redis.call('GET', k) == v then
    redis.call('DEL', k)
    redis.call('PUBLISH', ARGV[1], k)
    local floor = string.match(v, '^baton (%d+) ')
    wakeHead(KEYS[i + 1], KEYS[i + 2], ARGV[2], k, nowms, KEYS[i + 3], ARGV[3], KEYS[i + 4], KEYS[i + 5], floor)
    n = n + 1
  end
end
return n
`)

// leaveScript takes a process out of a lease's queue, and passes a
// wake-up on to the next waiting process when the lease is free (the
// leaving one may have been woken for it, and the lease kept for it).
// KEYS[1] the lease key, KEYS[2] its queue, KEYS[3] its queue's
// deadlines, KEYS[4] its woken key, KEYS[5] its grant entries' key
// prefix; ARGV[1]
// the process ID, ARGV[2] the
// prefix of the process channels, ARGV[3] how long (ms) the lease is kept
// for a woken process. It returns 1 when it woke another process.
var leaveScript = goredis.NewScript(wakeHeadLua + `
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('DEL', KEYS[5] .. ':' .. ARGV[1])
if redis.call('GET', KEYS[4]) == ARGV[1] then redis.call('DEL', KEYS[4]) end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return wakeHead(KEYS[2], KEYS[3], ARGV[2], KEYS[1], servertime(), KEYS[4], ARGV[3])
`)

// storeStateScript sets the state key while the lease key holds the
// term's value. KEYS[1] the lease key, KEYS[2] the state key; ARGV[1] the
// value, ARGV[2] the state. It returns 1, or 0 when the term is over.
var storeStateScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
return 1
`)

// evalWait runs script and then, in the same round trip, WAIT for
// replicas (when replicas > 0). It returns the script's result and how
// many replicas acknowledged (replicas itself when none were asked for).
// A script the server does not have (after SCRIPT FLUSH, a restart or a
// failover to a server that never ran it) is loaded and run again.
func (b *Backend) evalWait(ctx context.Context, script *goredis.Script, keys []string, args ...any) (any, int, error) {
	for try := 0; ; try++ {
		pipe := b.c.Pipeline()
		res := script.EvalSha(ctx, pipe, keys, args...)
		var wait *goredis.Cmd
		if b.o.Replicas > 0 {
			wait = pipe.Do(ctx, "WAIT", b.o.Replicas, b.o.wait.Milliseconds())
		}
		_, err := pipe.Exec(ctx)
		if err := res.Err(); err != nil && try == 0 && isNoScript(err) {
			if err := script.Load(ctx, b.c).Err(); err != nil {
				return nil, 0, err
			}
			continue
		}
		if err := res.Err(); err != nil {
			return nil, 0, err
		}
		if err != nil && err != goredis.Nil {
			return nil, 0, err
		}
		acked := b.o.Replicas
		if wait != nil {
			n, err := wait.Int64()
			if err != nil {
				return nil, 0, err
			}
			acked = int(n)
		}
		return res.Val(), acked, nil
	}
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
