-- wrk script for bench/daemon/ledger.sh: a max_tokens 1 chat completion with
-- a prompt of about 50 tokens (the tiny preset's tokenizer spends about a
-- token per character of this text, plus the chat template's). Each prompt
-- starts with a tag unique to the run, the wrk thread and the request, so
-- that no round finds earlier rounds' prompts in the prefix cache.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
local tag
local n = 0
function init(args)
  tag = tostring(os.time()) .. "-" .. tostring(id)
end
request = function()
  n = n + 1
  local body = '{"messages":[{"role":"user","content":"' .. tag .. '-' .. n ..
    ': summarise the usage of each tenant"}],' ..
    '"max_tokens":1,"thinking_budget":0,"temperature":0}'
  return wrk.format(nil, nil, nil, body)
end
