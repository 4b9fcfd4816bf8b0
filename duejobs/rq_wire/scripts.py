"""The Lua scripts through which duejobs writes and reads its jobs in Redis, each one atomic:
a push that never makes a second live job, the check of whether Redis can still hand a job to
a worker, the promotion of jobs due by the database clock, a put-back into the scheduled
registry, a removal, a take-off for a queue that moved, RQ's registry cleanup (see
:mod:`duejobs.delivery` for what they promise), and the worker's take and finish (see
:mod:`duejobs.rq_wire.worker_side`).

The scripts name job hashes, and some of them queues and registries, through prefixes given
as arguments (:mod:`duejobs.rq_wire.keys`), not as declared keys.
"""

from __future__ import annotations

from datetime import timedelta

# A row overdue by more than this whose job is not on its queue or in its scheduled registry is
# missing, whatever its job hash says: no live worker waits that long between taking a job
# from Redis and claiming its row (the claim's lock wait is bounded, an early delivery waits at
# most a second). A worker merely slow there meets a second delivery, which it skips.
STUCK_AFTER = timedelta(seconds=15)

# A queue list longer than this is not read to check a ``queued`` hash: its id is trusted to
# be there (a call reads at most this many entries per queue; in-flight quotas keep queues
# far shorter).
LIST_SCAN_LIMIT = 10_000
# Whether Redis can still hand a job to a worker. A job hash alone proves nothing: its id may
# be gone from the queue list (a worker popped it and died before marking it started, an
# operator trimmed the list) or from the scheduled registry, or the worker that started it
# may be dead. ``strict`` (the row is overdue by more than ``STUCK_AFTER``) trusts only the
# queue list and the registry: a job half-way between RQ's lists or marked started, with
# its row still waiting for a worker's claim that long, is missing. ``unpushed`` (the row
# has no queue job: the scheduler's claim, a reconciler's first push) counts no started
# job: a live worker holding one for such a row is finishing it after turning the row back
# (a rate limit's turn-back), and its finish, which writes only while its own run's entry is
# in the started registry, writes nothing once the job is replaced.
PRESENT = """
local listed = {}
local function on_queue(queue_key, id, strict, limit)
    local ids = listed[queue_key]
    if ids == nil then
        if redis.call('LLEN', queue_key) > limit then  -- too long to read: trust the hash
            listed[queue_key] = false
            return true
        end
        ids = {}
        for _, v in ipairs(redis.call('LRANGE', queue_key .. ':intermediate', 0, -1)) do
            ids[v] = 'moving'
        end
        for _, v in ipairs(redis.call('LRANGE', queue_key, 0, -1)) do ids[v] = 'queued' end
        listed[queue_key] = ids
    end
    if ids == false then return true end
    return ids[id] == 'queued' or (ids[id] == 'moving' and not strict)
end
local function present(job_key, id, status, queue_key, registry_key, score, strict, workers,
                       unpushed)
    if status == 'queued' then return on_queue(queue_key, id, strict, LIST_LIMIT) end
    if status == 'scheduled' then
        local at = redis.call('ZSCORE', registry_key, id)
        return at ~= false and tonumber(at) <= score + 0.001
    end
    if status == 'started' and not strict and not unpushed then
        local worker = redis.call('HGET', job_key, 'worker_name')
        return worker ~= false and worker ~= '' and redis.call('EXISTS', workers .. worker) == 1
    end
    return false
end
"""

# A batch of one RQ queue's jobs pushed. KEYS: its list, its scheduled registry, its list
# between RQ's lists, its started registry; on one node also RQ's set of queues and duejobs'.
# ARGV: the job-hash prefix, now, RQ's stamp, the live-worker prefix, the template's length
# and fields, the queue's name; then per job its id, data, score, front, stuck, unpushed.
PUSH_SCRIPT = (
    f"local LIST_LIMIT = {LIST_SCAN_LIMIT}\n"
    + PRESENT
    + """
-- A dead worker's entry in the started registry (``id:execution``, or ``id`` alone) would
-- outlive the job that replaces its hash: RQ 2.x's registry cleanup fails whatever job
-- then has that id once the entry expires, even a queued one.
local function unstart(started_key, id)
    redis.call('ZREM', started_key, id)
    local cursor = '0'
    repeat
        local page = redis.call('ZSCAN', started_key, cursor, 'MATCH', id .. ':*', 'COUNT', 1000)
        cursor = page[1]
        for j = 1, #page[2], 2 do redis.call('ZREM', started_key, page[2][j]) end
    until cursor == '0'
end
local prefix, now, stamp, workers = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local ntemplate = tonumber(ARGV[5])
local template = {}
for i = 1, ntemplate do template[i] = ARGV[5 + i] end
local queued, deferred, present_, created, front = 0, 0, 0, {}, {}
if #KEYS > 4 then  -- one node: the sets of every queue, written here (a cluster's apart)
    redis.call('SADD', KEYS[5], KEYS[1])
    redis.call('SADD', KEYS[6], ARGV[6 + ntemplate])
end
for i = 7 + ntemplate, #ARGV, 6 do
    local id, key, score = ARGV[i], prefix .. ARGV[i], tonumber(ARGV[i + 2])
    local status = redis.call('HGET', key, 'status')
    local strict, unpushed = ARGV[i + 4] == '1', ARGV[i + 5] == '1'
    if status and present(key, id, status, KEYS[1], KEYS[2], score, strict, workers,
                          unpushed) then
        present_ = present_ + 1
    else
        if status then  -- a stale hash: replace it, and any stray entry of its id
            redis.call('DEL', key)
            redis.call('LREM', KEYS[3], 0, id)
            redis.call('ZREM', KEYS[2], id)
            unstart(KEYS[4], id)
        end
        created[#created + 1] = id
        redis.call('HSET', key, 'data', ARGV[i + 1], 'description', 'duejobs ' .. id,
                   'created_at', stamp, unpack(template))
        if score <= now then
            redis.call('HSET', key, 'status', 'queued', 'enqueued_at', stamp)
            if ARGV[i + 3] == '1' then
                front[#front + 1] = id
            else
                redis.call('RPUSH', KEYS[1], id)
            end
            queued = queued + 1
        else
            redis.call('HSET', key, 'status', 'scheduled')
            redis.call('ZADD', KEYS[2], score, id)
            deferred = deferred + 1
        end
    end
end
for j = #front, 1, -1 do redis.call('LPUSH', KEYS[1], front[j]) end
return {queued, deferred, present_, created}
"""
)

LIVE_SCRIPT = (
    f"local LIST_LIMIT = {LIST_SCAN_LIMIT}\n"
    + PRESENT
    + """
local prefix, queues, registries, workers = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local answer = {}
for i = 5, #ARGV, 3 do
    local key = prefix .. ARGV[i]
    local state = redis.call('HMGET', key, 'status', 'origin')
    local ok = state[1] and state[2] and present(key, ARGV[i], state[1], queues .. state[2],
        registries .. state[2], tonumber(ARGV[i + 1]), ARGV[i + 2] == '1', workers, false)
    answer[#answer + 1] = ok and 1 or 0
end
return answer
"""
)

# Jobs due by ARGV[2] (the database clock) moved from the scheduled registry onto the queue,
# at most ARGV[3]; returns how many, and the score of the earliest job left (nil: none), so
# that the scheduler's next pass can start when that one falls due. When nothing is due it
# costs one command, as a bare ZRANGEBYSCORE did (an idle scheduler calls it every poll).
PROMOTE_SCRIPT = """
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] == nil or tonumber(first[2]) > tonumber(ARGV[2]) then
    return {0, first[2] or false}
end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local pushed = 0
for _, id in ipairs(ids) do
    local key = ARGV[1] .. id
    if redis.call('HGET', key, 'status') == 'scheduled' then
        redis.call('HSET', key, 'status', 'queued', 'enqueued_at', ARGV[4])
        redis.call('RPUSH', KEYS[2], id)
        pushed = pushed + 1
    end
    redis.call('ZREM', KEYS[1], id)
end
local next = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {pushed, next[2] or false}
"""

DEFER_SCRIPT = """
if redis.call('EXISTS', ARGV[1]) == 1 then
    redis.call('HSET', ARGV[1], 'status', 'scheduled')
    redis.call('PERSIST', ARGV[1])
    redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
    return 1
end
return 0
"""

# Superseded jobs still waiting, taken out where each one's status says it waits: a
# ``scheduled`` one from the scheduled registry (ARGV[3] + its queue: a ZREM), a ``queued`` one
# from its queue's list (ARGV[2] + its queue), found from the tail, where the jobs pushed last
# are, and once (it is there once: LREM reads a list to its end for a count of 0, which made
# every change cost Redis a scan of the whole backlog). Its hash (ARGV[1] + id) is deleted.
# ARGV[4...]: the ids. Returns a flag per id: 1 removed, 0 started or gone (left alone).
REMOVE_SCRIPT = """
local removed = {}
for i = 4, #ARGV do
    local id = ARGV[i]
    local key = ARGV[1] .. id
    local status = redis.call('HGET', key, 'status')
    removed[i - 3] = 0
    if status == 'queued' or status == 'scheduled' then
        local origin = redis.call('HGET', key, 'origin')
        if status == 'scheduled' then
            redis.call('ZREM', ARGV[3] .. origin, id)
        else
            redis.call('LREM', ARGV[2] .. origin, -1, id)
        end
        redis.call('DEL', key)
        removed[i - 3] = 1
    end
end
return removed
"""


# Takes waiting jobs off a queue of a node the queue has left (``duejobs nodes drain``): each
# id out of the scheduled registry (ARGV[3]) or the queue list (ARGV[2]: the first entry, a
# job is there once; the list is not scanned for an id the registry held), and its hash
# (prefix ARGV[1]) deleted unless a worker has started it. Returns how many ids were there.
TAKE_OFF_SCRIPT = """
local taken = 0
for i = 4, #ARGV do
    local id = ARGV[i]
    local n = redis.call('ZREM', ARGV[3], id)
    if n == 0 then
        n = redis.call('LREM', ARGV[2], 1, id)
    end
    if n > 0 then
        taken = taken + 1
        local status = redis.call('HGET', ARGV[1] .. id, 'status')
        if not status or status == 'queued' or status == 'scheduled' then
            redis.call('DEL', ARGV[1] .. id)
        end
    end
end
return taken
"""


# RQ's own registry cleanup, which RQ's worker runs every ten minutes in its loop (duejobs'
# worker has a loop of its own), by Redis' clock, on which the job hashes expire:
# KEYS[1] ``rq:workers``; then per RQ queue its finished, failed and started registries and its
# worker set. ARGV: the job-hash prefix, the worker-key prefix, the result TTL, the most
# entries removed per registry and call, RQ's stamp of now.
# * finished and failed entries past their expiry (their hashes are gone) are removed, at most
#   ``most`` per registry: the oldest first, by rank (a count and a range: the call costs what
#   it removes, and a registry that grew while no reconciler ran is emptied over several calls
#   instead of blocking Redis in one);
# * a started entry whose worker stopped refreshing it (its score passed) and whose worker's
#   key is gone is removed, its hash, still ``started``, failed into the failed registry to
#   expire there as RQ's cleanup of abandoned jobs does (the row is the reconciler's rescue);
#   an entry a live worker still holds is left alone, whatever the clocks say;
# * a worker set member whose key is gone (a worker SIGKILLed, its key expired) is removed (the
#   sets are read whole: their size is the live workers').
# * ARGV[6] '1' (one node): the worker sets are read here; on a cluster, whose worker keys
#   live in slots of their own, the caller buries them apart (KEYS[1] is then any key of the
#   queue's slot, and a started entry's worker is known alive by its mark in that slot).
# Returns the counts: expired entries, abandoned started entries, dead workers; and 1 when a
# registry had more to remove than ``most`` (call again), else 0.
CLEAN_SCRIPT = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local prefix, workers, ttl, most, stamp = ARGV[1], ARGV[2], tonumber(ARGV[3]),
    tonumber(ARGV[4]), ARGV[5]
local expired, abandoned, dead, more = 0, 0, 0, 0
local function bury(set)
    for _, key in ipairs(redis.call('SMEMBERS', set)) do
        if redis.call('EXISTS', key) == 0 then
            dead = dead + redis.call('SREM', set, key)
        end
    end
end
local function expire(registry)
    local due = redis.call('ZCOUNT', registry, '-inf', now)
    if due > most then
        due, more = most, 1
    end
    if due > 0 then
        expired = expired + redis.call('ZREMRANGEBYRANK', registry, 0, due - 1)
    end
end
local sets = ARGV[6] == '1'
if sets then bury(KEYS[1]) end
for i = 2, #KEYS, 4 do
    expire(KEYS[i])
    expire(KEYS[i + 1])
    local stale = redis.call('ZRANGEBYSCORE', KEYS[i + 2], '-inf', now, 'LIMIT', 0, most)
    for _, member in ipairs(stale) do
        local id = string.match(member, '^(.*):[^:]*$') or member
        local key = prefix .. id
        local worker = redis.call('HGET', key, 'worker_name')
        if not worker or redis.call('EXISTS', workers .. worker) == 0 then
            redis.call('ZREM', KEYS[i + 2], member)
            if redis.call('HGET', key, 'status') == 'started' then
                redis.call('HSET', key, 'status', 'failed', 'ended_at', stamp)
                redis.call('EXPIRE', key, ttl)
                redis.call('ZADD', KEYS[i + 1], now + ttl, id)
            end
            abandoned = abandoned + 1
        end
    end
    if sets then bury(KEYS[i + 3]) end
end
return {expired, abandoned, dead, more}
"""


# The most results RQ keeps in a job's results stream (RQ's own ``maxlen``).
RESULTS_KEPT = 10

# The worker's take and finish (:meth:`duejobs.rq_wire.worker_side.RqWire.take`).
TAKE = (
    """
-- One script for what the worker writes as jobs come and go: the jobs that ran finished,
-- then up to ``most`` waiting jobs taken, then the worker's key once.
-- KEYS[1]: the worker's key; then, per RQ queue in this take's order (its bands: see
--   duejobs.rq_wire.bands), its list and its started registry.
-- ARGV[1..9]: most, job key prefix, now (RQ's format), started score, worker name, run-id
--   base, an id popped already (or ''), that id's queue index, the worker's state when no
--   job is taken ('' to leave it);
-- ARGV[10..13], with jobs finished: results key prefix, successful count, failed count,
--   working time; then per job: id, started registry, run id, registry, score, ttl, status,
--   result type, field, value.
local most, prefix, stamp, score = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local worker, base = ARGV[5], ARGV[6]
local figures = {}
if #ARGV > 9 then
    local results = ARGV[10]
    figures = {'successful_job_count', ARGV[11], 'failed_job_count', ARGV[12],
               'total_working_time', ARGV[13]}
    for i = 14, #ARGV, 10 do
        local id, ttl = ARGV[i], ARGV[i + 5]
        local key, run = prefix .. id, id .. ':' .. ARGV[i + 2]
        -- Once per run: a script sent again after its answer was lost finds the run's started
        -- entry gone, and writes nothing twice. A results stream Redis refuses puts the entry
        -- back as it was, nothing of this job written, for a second try.
        if redis.call('ZREM', ARGV[i + 1], run) == 1 then
            local added = redis.pcall('XADD', results .. id, 'MAXLEN', '~', '"""
    + str(RESULTS_KEPT)
    + """', '*',
                                      'type', ARGV[i + 7], 'worker_name', worker, ARGV[i + 8],
                                      ARGV[i + 9])
            if type(added) == 'table' and added.err then
                redis.call('ZADD', ARGV[i + 1], score, run)
                return redis.error_reply(added.err)
            end
            redis.call('EXPIRE', results .. id, ttl)
            redis.call('HSET', key, 'status', ARGV[i + 6], 'ended_at', stamp,
                       'last_heartbeat', stamp)
            redis.call('EXPIRE', key, ttl)
            redis.call('ZADD', ARGV[i + 3], ARGV[i + 4], id)
        end
    end
end
local taken = {}
local function start(id, q)
    local key = prefix .. id
    local data = redis.call('HGET', key, 'data')
    if not data then  -- its hash is gone: handed back unread, nothing written
        taken[#taken + 1] = {id, q, '', ''}
        return
    end
    local run = base .. #taken
    redis.call('HSET', key, 'status', 'started', 'started_at', stamp, 'last_heartbeat', stamp,
               'worker_name', worker)
    redis.call('ZADD', KEYS[2 * q + 1], score, id .. ':' .. run)
    taken[#taken + 1] = {id, q, data, run}
end
if ARGV[7] ~= '' then start(ARGV[7], tonumber(ARGV[8])) end
-- Each RQ queue in this take's order gives what it holds, up to the room left. Where Redis
-- has LMPOP (7.0), one call takes from the first that holds jobs, the next from those after it
-- (that one is empty then): one command where an LPOP per empty band would cost one each.
local listed = (#KEYS - 1) / 2
if redis.REDIS_VERSION_NUM then
    local q = 1
    while q <= listed and most - #taken > 0 do
        local call = {'LMPOP', listed - q + 1}
        for i = q, listed do call[#call + 1] = KEYS[2 * i] end
        call[#call + 1], call[#call + 2], call[#call + 3] = 'LEFT', 'COUNT', most - #taken
        local popped = redis.call(unpack(call))
        if not popped then break end
        while KEYS[2 * q] ~= popped[1] do q = q + 1 end
        for _, id in ipairs(popped[2]) do start(id, q) end
        q = q + 1
    end
else  -- Redis 6.2
    for q = 1, listed do
        if most - #taken <= 0 then break end
        local popped = redis.call('LPOP', KEYS[2 * q], most - #taken)
        if popped then
            for _, id in ipairs(popped) do start(id, q) end
        end
    end
end
local state = #taken > 0 and 'busy' or ARGV[9]
if state ~= '' then
    figures[#figures + 1] = 'state'
    figures[#figures + 1] = state
end
if #figures > 0 then redis.call('HSET', KEYS[1], unpack(figures)) end
return taken
"""
)
