-- wrk script: POST a max_tokens 1 chat completion on every request.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"thinking_budget":0,"temperature":0}'
