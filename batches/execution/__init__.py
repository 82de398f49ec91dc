"""The execution pipeline, owned by `batches` (it owns items and leases).

    claim+prepare ──bounded queue──► generate ──queue──► record
    (own thread)                     (engine)             (own thread)

- claim + prepare (`prepare.py`): leases items in groups (fair between organizations,
  earliest deadline first, attempts bounded), reads their lines through one decrypting
  stream per batch, renders and tokenizes (`inference.chat_completions`).
- generate: `inference`'s engine, a library that knows nothing of batches; a request that
  makes it raise is isolated and ends as that item's error (`pipeline.py`).
- record (`record.py`): writes results in groups, one transaction each, every row under its
  fencing token; per-item usage facts are available inside that transaction
  (`record.usage_recorded`); decides "no open item left" once per batch.
"""

from batches.execution.pipeline import serve_key, serving_nothing

__all__ = ["serve_key", "serving_nothing"]
