"""The execution pipeline, owned by `batches` (it owns items and leases).

    claim+prepare ──bounded queue──► generate ──queue──► record
    (own thread)                     (engine)             (own thread)

- entry (`pipeline.py`): `serve_wake`, what an `engine_wake` message does (the run, the
  batches it finishes finalized in this process, another wake-up while work remains);
  `serve_key`, one run for an engine key.
- claim + prepare (`run.py`, `prepare.py`): the run leases groups from the work queue
  (`batches.queue.claim`: fair between organizations, earliest deadline first, attempts
  bounded), only as many as the engine's queue has room for; the prepare stage reads their
  lines through one decrypting stream per batch, renders and tokenizes
  (`inference.chat_completions`).
- generate: `inference`'s engine, a library that knows nothing of batches; a request that
  makes it raise is isolated and ends as that item's error (`run.py`).
- record (`record.py`): writes results in groups, one transaction each, every row under its
  fencing token, metered in that transaction (`batches.queue.items_meter`); decides "no open
  item left" once per batch.
"""

from batches.execution.pipeline import serve_key, serve_wake, serving_nothing

__all__ = ["serve_key", "serve_wake", "serving_nothing"]
