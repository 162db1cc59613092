-- Shipped by orchestrator; loaded by the rendered haproxy.cfg (lua-load). Do not edit: the next
-- apply rewrites it.
--
-- Models on demand: `http-request lua.demand_hold SOCKET DEADLINE_S RETRY_AFTER_S` holds a request
-- for a model whose backend has no usable server while the agent wakes or starts it. One Unix
-- connection per held request: it sends {"model": NAME, "stream": BOOL}, the agent answers
-- {"waiting": ...} lines (at least one a second), then one final line:
--   {"ready": true}                         -> txn.demand = "ready" (the backend's use-server and
--                                              force-persist send it to the engine, even one the
--                                              config still lists as disabled)
--   {"status": 429|404|503, "message": ...,  -> txn.demand = "429" | "404" | "503", the message as
--    "retry_after_s": N or null}               a JSON string literal in txn.demand_message, Retry-After
--                                              in txn.demand_retry (the config writes the error body)
-- The agent gone (its socket refuses, or closes before the final line): tried again every RETRY_MS
-- while it may be restarting (systemd brings a killed agent back: RestartSec=2 and its start), for
-- AGENT_BACK_S at most; the new agent gets the request afresh and answers it. Gone for longer, silent
-- for IDLE_S (hung, not gone), or no final line within DEADLINE_S: txn.demand = "503".
-- A client that goes away ends this action (`option abortonclose` on the frontend): the connection
-- closes, which tells the agent nobody waits any more. HAProxy 2.6 logs that end as "aborting Lua
-- processing on expired timeout" (it resumes the action once with yielding forbidden, and the
-- receive below yields); Lua cannot see the client go while it waits, so the line stays (README).

local IDLE_S = 5 -- the agent sends a line at least every 1.0 s; this much silence means it hung
local AGENT_BACK_S = 15 -- a killed agent is back within this (systemd's RestartSec=2, its start)
local RETRY_MS = 250

local function now()
  local t = core.now()
  return t.sec + t.usec / 1e6
end

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return string.format("\\u%04x", c:byte()) end) .. '"'
end

-- The value of "message" in a JSON line, as the JSON string literal it is there (escapes kept, so
-- it goes into the error body verbatim); nil when the line has none or it is malformed.
local function message_literal(line)
  local start = line:find('"message"%s*:%s*"')
  if start == nil then return nil end
  local open = line:find('"', line:find(':', start + 9) + 1, true)
  local i = open + 1
  while i <= #line do
    local c = line:sub(i, i)
    if c == '\\' then
      i = i + 2
    elseif c == '"' then
      return line:sub(open, i)
    elseif c:byte() < 0x20 then
      return nil
    else
      i = i + 1
    end
  end
  return nil
end

local function answer(txn, status, message)
  txn:set_var("txn.demand", status)
  txn:set_var("txn.demand_message", message)
end

local function give_up(txn, sock, why)
  answer(txn, "503", json_string(why))
  sock:close()
end

-- One connection to the agent until its final line: true when the request is answered (txn.demand
-- set), false when the agent went away first (refused, closed), and then whether it had answered at
-- all on this connection (its gone time counts from then); a hang or the deadline answers 503.
local function ask(txn, socket_path, deadline, deadline_s, model, stream)
  local sock = core.tcp()
  sock:settimeout(IDLE_S)
  if not sock:connect("unix@" .. socket_path) then
    sock:close()
    return false, false
  end
  if not sock:send('{"model": ' .. json_string(model) .. ', "stream": ' .. tostring(stream) .. '}\n') then
    sock:close()
    return false, false
  end
  local heard = false
  while true do
    local left = deadline - now()
    if left <= 0 then
      give_up(txn, sock, "no answer from the agent on " .. socket_path .. " within " .. deadline_s .. " s")
      return true
    end
    local wait_s = math.max(1, math.min(IDLE_S, math.ceil(left)))
    sock:settimeout(wait_s)
    local asked = now()
    local line = sock:receive("*l")
    if line == nil then
      -- A timeout and a close read the same here: silence for the whole wait is a hang (or the
      -- deadline), an end before it is the agent gone.
      if now() >= deadline then
        give_up(txn, sock, "no answer from the agent on " .. socket_path .. " within " .. deadline_s .. " s")
        return true
      end
      if now() - asked >= wait_s - 0.1 then
        give_up(txn, sock, "the agent on " .. socket_path .. " fell silent before answering")
        return true
      end
      sock:close()
      return false, heard
    end
    heard = true
    if line:find('"ready"%s*:%s*true') then
      txn:set_var("txn.demand", "ready")
      sock:close()
      return true
    end
    local status = line:match('"status"%s*:%s*(%d+)')
    if status ~= nil then
      if status ~= "429" and status ~= "404" then status = "503" end
      answer(txn, status, message_literal(line) or json_string("the agent refused the request (" .. status .. ")"))
      local retry = line:match('"retry_after_s"%s*:%s*(%d+)')
      if retry ~= nil then txn:set_var("txn.demand_retry", retry) end
      sock:close()
      return true
    end
    -- a {"waiting": ...} line: keep holding
  end
end

core.register_action("demand_hold", { "http-req" }, function(txn, socket_path, deadline_s, retry_after_s)
  local model = txn:get_var("txn.model") or ""
  local s = txn:get_var("txn.stream")
  local stream = s == true or s == 1 or s == "1" or s == "true"
  local deadline = now() + tonumber(deadline_s)
  txn:set_var("txn.demand_retry", retry_after_s)
  local gone_since = nil
  while true do
    local answered, heard = ask(txn, socket_path, deadline, deadline_s, model, stream)
    if answered then return end
    if heard then gone_since = nil end
    gone_since = gone_since or now()
    if now() - gone_since >= AGENT_BACK_S or now() >= deadline then
      answer(txn, "503", json_string("the agent does not answer on " .. socket_path))
      return
    end
    core.msleep(RETRY_MS)
  end
end, 3)
