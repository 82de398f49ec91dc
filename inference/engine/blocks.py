"""The block manager: the only door between the scheduler and the key/value pool's blocks.

Sequences hold block tables; this module alone fills and empties them (and their copy on the
device, tables.py) and so alone touches the pool's reference counts (kv.py): reserving blocks
for the tokens a step will compute (copying a shared block before it is written), reading a
prompt's next blocks from the prefix cache, sealing the blocks that became full (hashing them
for the cache), sharing a prefilled prompt with the other choices of its request (fork), and
giving blocks back when a sequence ends or is preempted, and, for a model whose every layer
has a sliding window, as soon as no layer's window reaches them (`slide`).

A full block's digest chains its tokens to everything before it (its parent's digest), the
request's cache scope and the media whose placeholders it holds (kv.block_digest).
"""

from __future__ import annotations

import math

from .kv import BlockPool, block_digest
from .sequence import Sequence
from .types import GenerationRequest, MediaInput


class BlockManager:
    def __init__(self, pool: BlockPool, *, prefix_cache: bool, window: int | None = None) -> None:
        """`window`: the widest sliding window of the model's layers when every layer has
        one (None: keys stay read until the sequence ends)."""
        self.pool = pool
        self.block_size = pool.block_size
        self.prefix_cache = prefix_cache
        self.window = window

    @property
    def available(self) -> int:
        """Blocks that can be handed out now (free, or cached and unreferenced)."""
        return self.pool.available

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def could_hold(self, tokens: int, copies: int) -> bool:
        """Whether `copies` sequences of `tokens` each fit in the whole memory at once (block 0
        is never handed out)."""
        return math.ceil(tokens / self.block_size) * copies <= self.pool.num_blocks - 1

    def clear_cache(self) -> None:
        """Forget the cached blocks of finished requests (none may be held)."""
        self.pool.clear_cache()

    def index_prompt(self, seq: Sequence) -> None:
        """Give a new sequence its prompt's block digests, when the prefix cache is on (the
        other choices of a request take them from the first when forked)."""
        if self.prefix_cache and seq.choice == 0:
            seq.prompt_digests = prompt_digests(seq.owner.spec, self.block_size)

    def needed(self, seq: Sequence, tokens: int) -> int:
        """New blocks `seq` takes to compute its next `tokens` tokens."""
        bs = self.block_size
        needed = max(0, math.ceil((seq.computed + tokens) / bs) - len(seq.blocks))
        if seq.computed % bs and self.pool.refs[seq.blocks[seq.computed // bs]] > 1:
            needed += 1  # copy on write
        return needed

    def needed_decoding(self, seqs: list[Sequence]) -> int:
        """New blocks these sequences take to compute one token each (`needed(seq, 1)`
        summed, without a call per sequence: the decoding step's hot path)."""
        bs, refs = self.block_size, self.pool.refs
        count = 0
        for seq in seqs:
            computed = seq.computed
            if computed % bs == 0:
                count += computed // bs >= len(seq.blocks)
            else:
                count += refs[seq.blocks[computed // bs]] > 1  # copy on write
        return count

    def grow_decoding(self, seqs: list[Sequence]) -> list[Sequence]:
        """Reserve the slot of one token for each sequence (`grow(seq, 1)`); returns those that
        got it. A sequence whose slot lies in a block it holds alone costs no call."""
        bs, refs = self.block_size, self.pool.refs
        fit: list[Sequence] = []
        for seq in seqs:
            computed = seq.computed
            index, offset = divmod(computed, bs)
            # Mid-block: a shared block is copied before it is written; at a block's start: a
            # new block unless it is reserved already.
            simple = refs[seq.blocks[index]] == 1 if offset else index < len(seq.blocks)
            if simple or self.grow(seq, 1):
                fit.append(seq)
        return fit

    def grow(self, seq: Sequence, want: int) -> int:
        """Reserve blocks for the next `want` tokens of `seq`; returns how many fit."""
        pool, bs = self.pool, self.block_size
        start = seq.computed
        if start % bs:
            index = start // bs
            shared = seq.blocks[index]
            if pool.refs[shared] > 1:
                own = pool.allocate()
                if own is None:
                    return 0
                pool.copy_block(src=shared, dst=own, tokens=start % bs)
                pool.release([shared])
                seq.blocks[index] = own
                pool.tables.set(seq, index, own)
        while len(seq.blocks) * bs < start + want:
            block = pool.allocate()
            if block is None:
                break
            pool.tables.set(seq, len(seq.blocks), block)
            seq.blocks.append(block)
        return max(0, min(want, len(seq.blocks) * bs - start))

    def reuse_cached(self, seq: Sequence) -> None:
        """Take cached blocks for the next full blocks of the sequence, as far as they match
        (leaving at least one token to compute, whose logits are needed)."""
        bs = self.block_size
        if not self.prefix_cache or seq.computed % bs or len(seq.blocks) * bs != seq.computed:
            return
        scope = seq.owner.spec.cache_scope
        counts_as_cached = not seq.tokens and seq.choice == 0 and not seq.preempted
        while seq.computed + bs <= seq.length - 1:
            digest = self._digest(seq, seq.computed // bs, scope)
            block = self.pool.lookup(digest)
            if block is None:
                return
            self.pool.tables.set(seq, len(seq.blocks), block)
            seq.blocks.append(block)
            seq.digests.append(digest)
            seq.computed += bs
            if counts_as_cached:
                seq.owner.cached_tokens += bs

    def seal(self, seq: Sequence) -> None:
        """Hash the blocks that became full and offer them to the prefix cache."""
        bs = self.block_size
        if len(seq.digests) >= seq.computed // bs:
            return
        scope = seq.owner.spec.cache_scope
        while len(seq.digests) < seq.computed // bs:
            i = len(seq.digests)
            digest = self._digest(seq, i, scope)
            seq.digests.append(digest)
            if self.prefix_cache:
                self.pool.register(seq.blocks[i], digest)

    def slide(self, seq: Sequence) -> None:
        """Give back the leading blocks whose keys no layer's window reaches any more: the
        next token to compute sits at position `seq.computed` or later and sees keys after
        `position - window`. Their entries point at block 0 from then on (zeroed, masked)."""
        if self.window is None:
            return
        dead = (seq.computed - self.window + 1) // self.block_size
        if dead <= seq.slid:
            return
        gone = seq.blocks[seq.slid : dead]
        self.pool.release(gone)
        for index in range(seq.slid, dead):
            seq.blocks[index] = 0
            self.pool.tables.set(seq, index, 0)
        seq.slid = dead

    def fork(self, seq: Sequence, fork: Sequence) -> None:
        """Let `fork` (another choice of the same request) share everything `seq` computed."""
        for block in seq.blocks[seq.slid :]:
            self.pool.share(block)
        fork.blocks = list(seq.blocks)
        fork.slid = seq.slid
        self.pool.tables.extend(fork, fork.blocks)
        fork.digests = list(seq.digests)
        fork.prompt_digests = seq.prompt_digests
        fork.computed = seq.computed

    def release(self, seq: Sequence) -> None:
        """Give the sequence's blocks back (it ended, failed or was aborted)."""
        self.pool.release(seq.blocks[seq.slid :])
        self.pool.tables.drop(seq)
        seq.blocks, seq.slid = [], 0

    def reset(self, seq: Sequence) -> None:
        """Give the blocks back and forget what they held: the sequence keeps its tokens and
        is computed again from its first token (preemption)."""
        self.release(seq)
        seq.digests, seq.computed = [], 0

    def _digest(self, seq: Sequence, index: int, scope: str) -> bytes:
        """The digest of block `index` of the sequence; blocks before it are in seq.digests."""
        if index < len(seq.prompt_digests):
            return seq.prompt_digests[index]
        lo, hi = index * self.block_size, (index + 1) * self.block_size
        parent = seq.digests[-1] if seq.digests else b""
        media = _media_key(seq.owner.spec.media, lo, hi)
        return block_digest(parent, scope, seq.span(lo, hi), media)


def prompt_digests(request: GenerationRequest, block_size: int) -> list[bytes]:
    """Digests of the prompt's full blocks, each chained to the one before it."""
    prompt, digests = request.prompt_ids, list[bytes]()
    for lo in range(0, len(prompt) - block_size + 1, block_size):
        hi = lo + block_size
        parent = digests[-1] if digests else b""
        media = _media_key(request.media, lo, hi)
        digests.append(block_digest(parent, request.cache_scope, prompt[lo:hi], media))
    return digests


def _media_key(media: list[MediaInput], lo: int, hi: int) -> bytes:
    """The digests of the media whose placeholders fall in tokens [lo, hi): identical
    placeholder ids of different images must not share cached blocks. Later blocks differ
    too, through their parent's digest."""
    if not media:
        return b""
    return b"".join(m.digest for m in media if m.start < hi and lo < m.start + m.length)
