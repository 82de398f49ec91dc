"""The files app's services, one job a module; callers import them from here.

- `writes.py`: storing an upload, publishing a result file, deleting and crypto-shredding
  (the API's delete, finalization, the retention sweeps).
- `reads.py`: plaintext out of the encrypted store: byte ranges (with the recovery copy as
  fallback), lines and request bodies of an input file in one pass.
- `rotation.py`: re-wrapping data keys under a new master key (`manage.py rotate_master_key`).

None of the three imports another.
"""

from files.services.reads import (
    ItemSpan,
    file_iter_bodies,
    file_iter_lines,
    file_read_range,
    line_index_span,
)
from files.services.rotation import REWRAP_PAGE, RewrapCounts, data_keys_rewrap
from files.services.writes import (
    RECOVERY_PREFIX,
    file_create_from_upload,
    file_delete,
    file_delete_leftover_blobs,
    file_publish_result,
    file_shred,
)

__all__ = [
    "RECOVERY_PREFIX",
    "REWRAP_PAGE",
    "ItemSpan",
    "RewrapCounts",
    "data_keys_rewrap",
    "file_create_from_upload",
    "file_delete",
    "file_delete_leftover_blobs",
    "file_iter_bodies",
    "file_iter_lines",
    "file_publish_result",
    "file_read_range",
    "file_shred",
    "line_index_span",
]
