"""The model runner: the inputs of a step, the forward over the paged pool, the logits.

It owns what the model itself decides: the attention implementation it runs, the key/value
pool (kv.py, its geometry and size from pool_sizing.py), the media encoders (media.py), and
the layout of a step's tokens. A step's work (sequences and how many of their tokens to
compute, from the scheduler) becomes token ids, positions, the slots to write and read and the
mask over them; the model's own attention runs unchanged over `PagedCache`; the last computed
position of each sequence gives its logits, and `sample` draws the next tokens from them.

Decoding rows and prompt pieces run as two forwards, so one-token rows are not padded to a
prompt piece's length; a failing batched forward is retried one sequence at a time to find the
request it belongs to (isolation.py, as a failing batched sampling is).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from . import attention as paged
from .allocator import keep_freed_memory
from .families import engine_refusal
from .graphs import DecodeGraphs, graphs_wanted
from .isolation import StepLogits, next_tokens, step_logits
from .kv import BlockPool, PagedCache
from .layout import Padded, PaddedSteps, packed_layout, padded_layout
from .media import MediaEncoder
from .pool_sizing import num_blocks, probe
from .sequence import Failed, Sequence, Work

_SUPPORTED_ATTENTION = ("sdpa", "eager")


class ModelRunner:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        context_length: int,
        max_batch_size: int,
        block_size: int,
        kv_cache_bytes: int | None,
        max_num_blocks: int | None,
        processor: Any,
        cuda_graphs: bool | None = None,
        ranks_check: Callable[[], None] | None = None,
    ) -> None:
        """Refuses (ValueError) a model whose attention the pool cannot serve; sizes the pool
        from `max_num_blocks`, else `kv_cache_bytes`, else the device (pool_sizing.py).
        `cuda_graphs`: capture decoding steps (graphs.py; None: on), only ever on CUDA.
        `ranks_check`: on tensor-parallel ranks, asked after a forward raised, before a
        request is blamed (lockstep.ranks_check)."""
        config = model.config
        attention = getattr(config, "_attn_implementation", "sdpa")
        if attention not in _SUPPORTED_ATTENTION:
            raise ValueError(f"attention {attention!r} is not supported; load with sdpa or eager")
        text = config.get_text_config(decoder=True)
        refused = engine_refusal(config.to_dict())
        if refused:
            raise ValueError(refused)
        keep_freed_memory()  # the process's allocator, once: steps reuse freed memory
        self._ranks_check = ranks_check
        self.model = model
        self.block_size = block_size
        # Media rows need the model's processor (its encoders run at prefill, media.py).
        self._media = MediaEncoder(model, processor) if processor is not None else None
        self.media_modalities = self._media.modalities if self._media else frozenset()
        self._attention = attention
        self.device = model.get_input_embeddings().weight.device
        self._dtype = model.get_input_embeddings().weight.dtype
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self._tokenizer_size = len(tokenizer)

        layers = text.num_hidden_layers
        self._text_config = text
        kv_heads, head_dim, probed = probe(model, text, self.device)
        self._paged = probed.routed
        window = getattr(text, "sliding_window", None) or 0
        # Positions for the layers' windows are worked out only where a layer may have one.
        self._windowed = 0 < window < context_length
        if self._windowed and not self._paged:
            raise ValueError(
                "models with a sliding window whose attention does not go through "
                "transformers' attention interface are not supported"
            )
        # Where every layer has a window, keys older than the widest are read by no layer
        # again: the block manager frees the blocks holding only such keys (blocks.py).
        self.window = probed.window if self._windowed else None
        element = torch.empty((), dtype=self._dtype).element_size()
        block_bytes = 2 * layers * kv_heads * head_dim * element * block_size
        self._key_width = head_dim * kv_heads / text.num_attention_heads
        if max_num_blocks is None:
            max_num_blocks = num_blocks(
                block_bytes,
                kv_cache_bytes=kv_cache_bytes,
                block_size=block_size,
                max_batch_size=max_batch_size,
                context_length=context_length,
                layers=layers,
                device=self.device,
            )
        self.kv_cache_bytes = max_num_blocks * block_bytes
        self.pool = BlockPool(
            num_layers=layers,
            num_blocks=max_num_blocks,
            block_size=block_size,
            kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=self._dtype,
            device=self.device,
        )
        self._cache = PagedCache(self.pool, gather=not self._paged)
        # Captured steps replay the paged attention; the gathered path stays eager.
        self._graphs = (
            DecodeGraphs(
                self._decode_step,
                self.device,
                max_rows=max_batch_size,
                max_width=math.ceil(context_length / block_size),
            )
            if self._paged and graphs_wanted(self.device, cuda_graphs)
            else None
        )

    def release_memory(self) -> None:
        """Hand the device's cached, unused memory back after an out-of-memory step."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def run(self, work: Work, failed: Failed) -> StepLogits:
        """Logits of the last computed position of each scheduled sequence, in the order of
        `work` (a row whose forward failed is marked, its request added to `failed`).
        Decoding rows and prompt pieces run as two forwards, so one token rows are not padded
        to a prompt piece's length (isolation.py)."""
        return step_logits(work, failed, self.forward, self._check_ranks)

    def next_tokens(
        self, logits: torch.Tensor, sequences: list[Sequence], failed: Failed
    ) -> list[int | None]:
        """The token each sequence samples from its row of `logits`; None for a sequence whose
        sampling raised (its request is added to `failed`; isolation.py)."""
        return next_tokens(logits, sequences, failed)

    def _check_ranks(self) -> None:
        # A forward's collective fails on every rank when a peer rank died: that is no
        # request's fault. The check raises LockstepBroken then (a BaseException: the engine
        # is broken and the worker hands its requests back), before any request is failed.
        if self._ranks_check is not None:
            self._ranks_check()

    def forward(self, work: Work) -> torch.Tensor:
        """Last-position logits ([rows, vocab]) of one forward over the scheduled tokens.

        Two layouts, whichever costs less (`_decode_padded`):

        - packed: the scheduled tokens (pieces of prompts, or one per decoding row) form one
          `[1, tokens]` row. Their keys are the union of the slots their sequences attend to,
          each slot once however many sequences share it (a common prefix's blocks), and a
          mask says which query may see which slot: one attention product for the step, no
          padding, no copy of a shared block per row.
        - padded (decoding rows only): a `[rows, 1]` batch, each row attending to its own
          context padded to the longest. Without shared blocks the packed product costs
          rows x (sum of the contexts), this one rows x (the longest), but each row's keys
          are gathered even where rows share them.
        """
        device, bs = self.device, self.block_size
        takes_list = [take for _, take in work]
        starts_list = [seq.computed for seq, _ in work]
        lengths_list = [a + b for a, b in zip(starts_list, takes_list, strict=True)]
        width = math.ceil(max(lengths_list) / bs)
        table = self.pool.tables.gather([seq for seq, _ in work], width)
        lengths = _to(lengths_list, device)
        distinct = self._distinct_blocks(work, lengths_list)
        padded = max(takes_list) == 1 and _decode_padded(
            distinct, lengths_list, bs, self._key_width
        )
        q_pos: torch.Tensor | None = None
        k_pos: torch.Tensor | None = None
        if padded:
            ids = _to([[seq.token_at(seq.computed)] for seq, _ in work], device)
            if self._media is None or not any(seq.owner.spec.media for seq, _ in work):
                return self.decode(ids, table, lengths)
            pad = padded_layout(table, lengths, block_size=bs, windowed=self._windowed)
            read, write, positions, allowed = pad.read, pad.write, pad.positions, pad.allowed
            q_pos, k_pos = pad.q_pos, pad.k_pos
            keep: int | torch.Tensor = 1
        else:
            ids = _to(
                [[t for seq, take in work for t in seq.span(seq.computed, seq.computed + take)]],
                device,
            )
            takes, starts = _to(takes_list, device), _to(starts_list, device)
            pairs = sum(t * -(-n // bs) for t, n in zip(takes_list, lengths_list, strict=True))
            slid = None
            if self.window is not None:  # blocks given back out of every window are not read
                slid_list = [seq.slid for seq, _ in work]
                if any(slid_list):
                    slid = _to(slid_list, device)
                    pairs -= sum(t * k for t, k in zip(takes_list, slid_list, strict=True))
            # Sizes the host knows are passed along, so that no op has to read a count back
            # from the device (a synchronisation on a GPU).
            packed = packed_layout(
                table,
                lengths,
                takes,
                starts,
                n_q=sum(takes_list),
                n_pairs=pairs,
                distinct=distinct,
                num_blocks=self.pool.num_blocks,
                block_size=bs,
                windowed=self._windowed,
                slid=slid,
            )
            read, write, positions, allowed = (
                packed.read,
                packed.write,
                packed.positions,
                packed.allowed,
            )
            keep = packed.keep
            q_pos, k_pos = packed.q_pos, packed.k_pos
        # Text only without an encoder: admission refuses media then.
        embeds = (
            None if self._media is None else self._media.embeddings(ids, work, packed=not padded)
        )
        tokens: dict[str, torch.Tensor] = (
            {"input_ids": ids} if embeds is None else {"inputs_embeds": embeds}
        )
        out = self._call_model(tokens, positions, write, read, allowed, q_pos, k_pos, keep)
        if isinstance(keep, int):
            logits = out.logits[:, -1]
        elif out.logits.shape[1] == keep.shape[0]:
            logits = out.logits[0]
        else:  # a model that ignores logits_to_keep (Qwen2-Audio) gives every position back
            logits = out.logits[0, keep]
        return self._usable(logits)

    def decode(
        self,
        ids: torch.Tensor,
        table: torch.Tensor,
        lengths: torch.Tensor,
        layouts: PaddedSteps | None = None,
    ) -> torch.Tensor:
        """Last-position logits ([rows, vocab]) of a padded decoding step of text rows, from
        its three inputs on the device: each row's new token ([rows, 1]), its block table
        ([rows, width]) and its length after the step ([rows]); replayed as a CUDA graph where
        one was captured. `layouts`: the rows' slots worked out already (`decode_layouts`)."""
        if self._graphs is not None:
            return self._usable(self._graphs.run(ids, table, lengths))
        if layouts is None:
            return self._usable(self._decode_step(ids, table, lengths))
        return self._usable(self._run_padded(ids, layouts.at(lengths, table.shape[1])))

    def decode_layouts(self, table: torch.Tensor) -> PaddedSteps | None:
        """The layouts of several `decode` steps over `table` (wide enough for the last), or
        None where the steps are replayed as graphs (which lay themselves out)."""
        if self._graphs is not None:
            return None
        return PaddedSteps(table, block_size=self.block_size, windowed=self._windowed)

    def decodes_padded(self, seqs: list[Sequence]) -> bool:
        """Whether a decoding step of these sequences (one token each) runs padded."""
        lengths = [seq.computed + 1 for seq in seqs]
        work = [(seq, 1) for seq in seqs]
        distinct = self._distinct_blocks(work, lengths)
        return _decode_padded(distinct, lengths, self.block_size, self._key_width)

    def _usable(self, logits: torch.Tensor) -> torch.Tensor:
        if self.vocab_size > self._tokenizer_size:
            # Padded embedding rows have no token behind them.
            logits[:, self._tokenizer_size :] = float("-inf")
        return logits

    def _call_model(
        self,
        tokens: dict[str, torch.Tensor],
        positions: torch.Tensor,
        write: torch.Tensor,
        read: torch.Tensor,
        allowed: torch.Tensor,
        q_pos: torch.Tensor | None,
        k_pos: torch.Tensor | None,
        keep: int | torch.Tensor,
    ) -> Any:
        """The model's forward over the pool: its own attention reads the step's slots
        (attention.py) where it goes through transformers' interface, else the cache gathers
        them and `allowed` becomes the model's attention mask."""
        cache = self._cache.point(write=write, read=read)
        if self._paged:
            step = paged.StepAttention(self.pool, read, allowed, q_pos, k_pos)
            with paged.implementation(self._text_config, paged.PAGED), paged.step(step):
                return self.model(
                    **tokens,
                    position_ids=positions,
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=keep,
                )
        mask: torch.Tensor = allowed
        if self._attention == "eager":
            mask = torch.zeros(allowed.shape, dtype=self._dtype, device=self.device).masked_fill_(
                ~allowed, torch.finfo(self._dtype).min
            )
        return self.model(
            **tokens,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=keep,
        )

    def _decode_step(
        self, ids: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """A padded decoding step from its three inputs alone (what graphs.py captures)."""
        pad = padded_layout(table, lengths, block_size=self.block_size, windowed=self._windowed)
        return self._run_padded(ids, pad)

    def _run_padded(self, ids: torch.Tensor, pad: Padded) -> torch.Tensor:
        out = self._call_model(
            {"input_ids": ids},
            pad.positions,
            pad.write,
            pad.read,
            pad.allowed,
            pad.q_pos,
            pad.k_pos,
            1,
        )
        return out.logits[:, -1]

    def _distinct_blocks(self, work: Work, lengths: list[int]) -> int:
        """How many distinct blocks the keys of the step's rows lie in (`lengths`: each row's
        keys). In steady decoding every sequence holding blocks is in the step and holds just
        the blocks it reads: then it is the pool's count of held blocks, without a look at the
        tables."""
        bs = self.block_size
        if len(work) == self.pool.tables.holders and all(
            len(seq.blocks) == -(-n // bs) for (seq, _), n in zip(work, lengths, strict=True)
        ):
            return self.pool.held
        return _distinct_blocks([seq.blocks for seq, _ in work], lengths, bs)


def _decode_padded(
    tables: int | list[list[int]], lengths: list[int], block_size: int, key_width: float
) -> bool:
    """Whether decoding rows are cheaper padded to the longest row than packed over the union
    of their slots (`tables`: the rows' block tables, or the number of distinct blocks in them).

    Per query, the packed product visits every distinct slot (a multiply-add per head and
    dimension, and a mask entry), the padded one gathers and reads its row's slots padded to
    the longest. Measured on CPU (engine runs of the tiny and bench demo models), a (query,
    slot) pair of the packed product costs about half of one gathered element, so the padded
    layout wins when the distinct slots outnumber the longest row `key_width / 2` times
    (`key_width`: key elements per query head, head_dim x kv_heads / heads): 32 rows of mixed
    lengths with 16-wide heads go padded (1.3x the engine's rate on the tiny model), with
    64-wide heads they stay packed (padded was 0.84x on the bench model), and so do rows
    sharing a prompt.
    """
    distinct = tables if isinstance(tables, int) else _distinct_blocks(tables, lengths, block_size)
    return 2 * distinct * block_size > max(lengths) * key_width


def _distinct_blocks(tables: list[list[int]], lengths: list[int], block_size: int) -> int:
    """How many distinct blocks the rows' keys lie in (block 0 stands for blocks given back
    out of every window, blocks.py `slide`: none)."""
    return len(
        {
            block
            for table, length in zip(tables, lengths, strict=True)
            for block in table[: math.ceil(length / block_size)]
        }
        - {0}
    )


def _to(values: list[Any], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)
