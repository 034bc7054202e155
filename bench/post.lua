-- wrk script: a fixed 512-byte JSON POST. MODE (env) picks the key:
--   none   no Idempotency-Key (pass-through)
--   new    a new key per request (B)
--   hot    one of HOT keys already completed (C: replays)
--   storm  one shared key per STORM consecutive requests of a thread (D)
--   replay the first SPAN keys each thread sent in an earlier `new` run
--          named RUN, over and over (replays spread over the store)
-- ADDRS (env, optional): "host:port host:port ...": thread i sends to the
-- (i mod n)-th address instead of the URL's (part F: one wrk, its two
-- threads on two gateways).
local mode = os.getenv("MODE") or "none"
local hot = tonumber(os.getenv("HOT") or "100")
local run = os.getenv("RUN") or tostring(os.time())
local storm = tonumber(os.getenv("STORM") or "64")
local span = tonumber(os.getenv("SPAN") or "1000")
local body = '{"amount":1200,"currency":"eur","pad":"' .. string.rep("x", 471) .. '"}'  -- 512 bytes
wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"

local counter = 0
local thread_id = 0
local threads = {}

local addrs = {}
for a in string.gmatch(os.getenv("ADDRS") or "", "%S+") do table.insert(addrs, a) end

function setup(thread)
  thread:set("id", #threads)
  if #addrs > 0 then
    local host, port = string.match(addrs[(#threads % #addrs) + 1], "^(.*):(%d+)$")
    thread.addr = wrk.lookup(host, port)[1]
  end
  table.insert(threads, thread)
end

function init(args)
  thread_id = id or 0
end

function request()
  counter = counter + 1
  local headers = {}
  if mode == "new" then
    headers["Idempotency-Key"] = run .. "-" .. thread_id .. "-" .. counter
  elseif mode == "hot" then
    headers["Idempotency-Key"] = string.format("hot-%012d", counter % hot)
  elseif mode == "replay" then
    headers["Idempotency-Key"] = run .. "-" .. thread_id .. "-" .. ((counter - 1) % span + 1)
  elseif mode == "storm" then
    headers["Idempotency-Key"] = run .. "-" .. thread_id .. "-storm-" .. math.floor(counter / storm)
  end
  return wrk.format(nil, nil, headers)
end
