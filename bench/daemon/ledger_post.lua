-- wrk script for bench/daemon/ledger.sh: a max_tokens 1 chat completion with
-- a prompt of about 50 tokens (the tiny preset's tokenizer spends about a
-- token per character of this text, plus the chat template's), a different
-- prompt per request so that the prefix cache does not make it cached input.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  local body = '{"messages":[{"role":"user","content":"request ' .. n ..
    ': summarise the usage of each tenant"}],' ..
    '"max_tokens":1,"thinking_budget":0,"temperature":0}'
  return wrk.format(nil, nil, nil, body)
end
