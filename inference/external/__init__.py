"""External engines: a revision whose rows an OpenAI-compatible server answers (vLLM, SGLang,
TGI, `transformers serve`, llm-d behind its gateway) instead of Boardwalk's own engine.

One small module a job, none importing torch or Django:

- `upstream`: where rows go (`Upstream`: base URL, model id, the key from the environment
  variable the revision names) and the rules for the URL and the variable's name;
- `check`: `upstream_check`, the server lists the model and answers a one-token request
  (`manage.py model inspect|add --check`);
- `client`: `UpstreamClient.send`, one row posted and its outcome classified (success,
  retryable with `Retry-After`, final, not sent past its deadline);
- `limits`: the adaptive in-flight limit per revision (AIMD between a floor and the
  revision's `max_in_flight`), bounded across worker processes by leases in Redis;
- `backoff`: jittered exponential waits honouring `Retry-After`, never past a deadline;
- `engine`: `ExternalEngine`, the `GenerationEngine` (inference/engine/protocol.py) the
  worker drives for such a revision: rows added are sent from one asyncio loop under the
  limit, retried with the backoff within their attempts and deadline, and come back from
  `step` as results with the server's answer and usage;
- `validation`: `answer_violation`, the rule a server's answer breaks against the row's
  `response_format` and `tools` (the row then ends as `invalid_model_output`);
- `streaming`: an interactive row relayed as a stream (`stream: true` upstream), its deltas
  passed on as they come and put back together into one answer with its usage;
- `priority`: interactive rows take the next free in-flight slot ahead of batch rows.

What exists and what is next: docs/DEPLOYMENT.md, "Batches on an existing engine fleet".
"""
