-- wrk's requests for bench/load.sh, with the token. LOAD_MODE=jobs: the job routes a dashboard
-- and scripts poll while jobs run, spread over the running jobs (LOAD_JOBS, their ids):
--   4/8 GET /v1/jobs/{id}, 1/8 GET /v1/jobs?limit=50, 1/8 GET /v1/jobs?state=running,
--   2/8 GET /v1/jobs/{id}/metrics?since=S (the last ~200 steps, as a chart polling for news asks:
--   the jobs' steps follow the wall clock from LOAD_T0, one every LOAD_INTERVAL_MS).
-- LOAD_MODE=page: GET /v1/jobs?limit=50&offset=K, K at random below LOAD_TOTAL.
-- done() writes the figures as "key value" lines, keys prefixed with LOAD_PREFIX.
local token = os.getenv("LOAD_TOKEN")
local mode = os.getenv("LOAD_MODE") or "jobs"
local ids = {}
for id in string.gmatch(os.getenv("LOAD_JOBS") or "1", "%d+") do ids[#ids + 1] = id end
local t0 = tonumber(os.getenv("LOAD_T0") or "0")
local interval = tonumber(os.getenv("LOAD_INTERVAL_MS") or "10")
local total = tonumber(os.getenv("LOAD_TOTAL") or "100000")

wrk.headers["Authorization"] = "Bearer " .. token

local n = 0
local fixed = {}
local threads = 0

function setup(thread)
    threads = threads + 1
    thread:set("tid", threads)
end

function init(args)
    -- each thread starts its rotation elsewhere, so the threads do not ask in lockstep
    n = (tid or 0) * 997
    math.randomseed(os.time() + n)
    for i, id in ipairs(ids) do
        fixed[i] = {wrk.format("GET", "/v1/jobs/" .. id)}
    end
    fixed.list = wrk.format("GET", "/v1/jobs?limit=50")
    fixed.running = wrk.format("GET", "/v1/jobs?state=running&limit=50")
end

function request()
    n = n + 1
    if mode == "page" then
        return wrk.format("GET", "/v1/jobs?limit=50&offset=" .. math.random(0, total - 50))
    end
    local i = n % #ids + 1
    local k = n % 8
    if k < 4 then return fixed[i][1] end
    if k == 4 then return fixed.list end
    if k == 5 then return fixed.running end
    local since = math.floor((os.time() - t0) * 1000 / interval) - 200
    if since < 0 then since = 0 end
    return wrk.format("GET", "/v1/jobs/" .. ids[i] .. "/metrics?since=" .. since)
end

function done(summary, latency, requests)
    local p = os.getenv("LOAD_PREFIX") or "wrk_"
    local e = summary.errors
    local s = summary.duration / 1e6
    local out = io.open(os.getenv("LOAD_OUT"), "a")
    out:write(string.format("%srequests %d\n%sduration_s %.2f\n%srps %.0f\n", p, summary.requests,
                            p, s, p, summary.requests / s))
    out:write(string.format("%serr_connect %d\n%serr_read %d\n%serr_write %d\n%serr_status %d\n" ..
                            "%serr_timeout %d\n", p, e.connect, p, e.read, p, e.write, p,
                            e.status, p, e.timeout))
    out:write(string.format("%sp50_ms %.2f\n%sp99_ms %.2f\n%smax_ms %.2f\n", p,
                            latency:percentile(50) / 1000, p, latency:percentile(99) / 1000, p,
                            latency.max / 1000))
    out:close()
end
