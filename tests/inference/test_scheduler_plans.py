"""The scheduler's plans without a model, in the style of vLLM's scheduler tests: a
`Scheduler` over a tiny CPU block pool (inference/engine/scheduler.py, blocks.py, kv.py),
driven as `Stepper.step` and `Stepper._sampled` drive it (inference/engine/stepping.py): admit,
`schedule()`, `computed(...)` with every forward ok, a fabricated token appended to each
sequence that samples, `finish(...)` for those at `max_new_tokens`. Each test asserts the
exact plans (sequence, tokens computed) step by step and the blocks they hold."""

from __future__ import annotations

from collections import Counter

import torch

from inference.engine.blocks import BlockManager
from inference.engine.kv import BlockPool
from inference.engine.sampling import row_sampling
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Failed, Request, Sequence
from inference.engine.types import GenerationRequest, SamplingParams

VOCAB = 64
TOKEN = 7  # what every sequence "samples"
CPU = torch.device("cpu")

# A step's plan: (request id, or "id/choice" for choices past the first; tokens computed).
Plan = list[tuple[str, int]]


def name(seq: Sequence) -> str:
    rid = seq.owner.spec.id
    return f"{rid}/{seq.choice}" if seq.choice else rid


def request(
    rid: str, prompt: list[int], max_new_tokens: int, *, n: int = 1, priority: int = 0
) -> GenerationRequest:
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, n=n, ignore_eos=True)
    return GenerationRequest(rid, prompt, params, priority=priority)


def tokens(start: int, count: int) -> list[int]:
    """`count` prompt tokens from `start` on (distinct prompts share no block)."""
    return [(start + i) % VOCAB for i in range(count)]


class Bench:
    """A scheduler over a pool of `num_blocks` blocks (block 0 is never handed out), built as
    `Engine.__init__` and `Engine.generate` build theirs, stepped as `Stepper.step` steps."""

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int = 4,
        max_batch_size: int = 4,
        max_step_tokens: int = 16,
        prefix_cache: bool = False,
        window: int | None = None,
    ) -> None:
        pool = BlockPool(
            num_layers=1,
            num_blocks=num_blocks,
            block_size=block_size,
            kv_heads=1,
            head_dim=1,
            dtype=torch.float32,
            device=CPU,
        )
        self.pool = pool
        self.blocks = BlockManager(pool, prefix_cache=prefix_cache, window=window)
        self.scheduler = Scheduler(
            self.blocks,
            max_batch_size=max_batch_size,
            max_step_tokens=max_step_tokens,
            context_length=1024,
            vocab_size=VOCAB,
            media_modalities=(),
            new_sequence=self._sequence,
        )
        self.finished: list[str] = []

    def _sequence(self, owner: Request, choice: int) -> Sequence:
        """As `Engine._sequence`: its sampling state, its prompt's block digests."""
        sampling = row_sampling(
            owner.spec.params, choice=choice, eos_ids=[], vocab_size=VOCAB, device=CPU
        )
        seq = Sequence(owner=owner, choice=choice, sampling=sampling)
        self.blocks.index_prompt(seq)
        return seq

    def submit(self, *requests: GenerationRequest) -> list[Request]:
        owners = []
        for r in requests:
            assert self.scheduler.refusal(r) is None
            owner = Request(r)
            self.scheduler.add(owner)
            owners.append(owner)
        return owners

    def admit(self) -> None:
        assert self.scheduler.admit() == []

    def step(self) -> Plan:
        """One iteration of the engine's loop: admit, plan, record, sample, finish."""
        self.admit()
        work = self.scheduler.schedule()
        plan = [(name(seq), take) for seq, take in work]
        failed = Failed()
        sampled, rows = self.scheduler.computed(work, [True] * len(work), failed)
        assert not failed.owners
        assert len(rows) == len(sampled)
        done = []
        for seq in sampled:
            seq.tokens.append(TOKEN)
            if len(seq.tokens) >= seq.owner.spec.params.max_new_tokens:
                done.append(seq)
        self.scheduler.finish(done)
        self.finished.extend(name(s) for s in done)
        self.check_books()
        return plan

    def running(self) -> list[str]:
        return [name(s) for s in self.scheduler.running]

    def waiting(self) -> list[str]:
        return [r.spec.id for r in self.scheduler.waiting]

    def seq(self, label: str) -> Sequence:
        (found,) = [s for s in self.scheduler.running if name(s) == label]
        return found

    def check_books(self) -> None:
        """Every reference count is the number of tables holding the block, and every block
        is held, free or cached: nothing leaked, nothing released twice."""
        pool = self.pool
        held = Counter(b for s in self.scheduler.running for b in s.blocks[s.slid :])
        assert 0 not in held
        for block in range(1, pool.num_blocks):
            assert pool.refs[block] == held[block], block
        assert pool.held == len(held)
        assert pool.available == pool.num_blocks - 1 - len(held)
        assert pool.tables.holders == sum(1 for s in self.scheduler.running if s.blocks)


# -- 1. admission under a full pool -----------------------------------------------------------


def test_a_request_that_does_not_fit_waits_oldest_first_until_blocks_free_up() -> None:
    b = Bench(num_blocks=8)  # 7 blocks of 4 tokens
    b.submit(request("A", tokens(0, 8), 4))
    assert b.step() == [("A", 8)]
    assert b.pool.available == 5
    # B takes ceil((12 + 1) / 4) + 1 = 5 blocks to admit; A may still take ceil(1 / 4) + 1 = 2
    # of the 5 left (inference/engine/scheduler.py `_needed`, `_pending`). C (2 blocks)
    # would fit, but waits behind the older B: admission stops at the first that does not.
    b.submit(request("B", tokens(20, 12), 2), request("C", tokens(40, 3), 2))
    for _ in range(2):
        assert b.step() == [("A", 1)]
        assert b.running() == ["A"]
        assert b.waiting() == ["B", "C"]
    assert b.step() == [("A", 1)]
    assert b.finished == ["A"]  # its 4th token; admission comes at the next step
    assert b.waiting() == ["B", "C"]
    assert b.pool.available == 7
    # A's blocks are back: both are admitted at the next step and prefilled in it.
    assert b.step() == [("B", 12), ("C", 3)]
    assert b.waiting() == []
    assert [len(b.seq(s).blocks) for s in ("B", "C")] == [3, 1]
    assert b.pool.available == 3
    assert b.step() == [("B", 1), ("C", 1)]
    assert b.finished == ["A", "B", "C"]
    assert b.pool.available == 7


# -- 2. preemption order ----------------------------------------------------------------------


def test_decoding_out_of_blocks_preempts_only_the_youngest_sequence() -> None:
    b = Bench(num_blocks=7)  # 6 blocks of 4 tokens
    b.submit(*(request(r, tokens(20 * i, 3), 8) for i, r in enumerate("ABC")))
    assert b.step() == [("A", 3), ("B", 3), ("C", 3)]
    for _ in range(5):  # at position 4 each takes its second block: 6 held, none left
        assert b.step() == [("A", 1), ("B", 1), ("C", 1)]
    assert b.pool.available == 0
    assert [s.computed for s in b.scheduler.running] == [8, 8, 8]
    # Each needs a third block now: C, the youngest, gives its two back, A and B take them.
    c = b.seq("C")
    c_blocks = list(c.blocks)
    assert b.step() == [("A", 1), ("B", 1)]
    assert c.preempted and not b.seq("A").preempted and not b.seq("B").preempted
    assert c.blocks == [] and c.computed == 0
    assert len(c.tokens) == 6  # its tokens stay
    assert sorted(b.seq("A").blocks[2:] + b.seq("B").blocks[2:]) == sorted(c_blocks)
    assert b.step() == [("A", 1), ("B", 1)]  # C waits: no block is free
    assert b.finished == ["A", "B"]
    # C is computed again (prompt and the 6 tokens it had), samples its 7th, decodes its 8th.
    assert b.step() == [("C", 9)]
    assert len(c.tokens) == 7
    assert b.step() == [("C", 1)]
    assert b.finished == ["A", "B", "C"]
    assert len(c.tokens) == 8


def test_an_interactive_sequence_is_never_preempted_for_a_batch_one() -> None:
    b = Bench(num_blocks=6, max_step_tokens=8)  # 5 blocks of 4 tokens
    b.submit(request("B", tokens(20, 3), 8))
    assert b.step() == [("B", 3)]
    # I is admitted after B (it is the younger), beside it: memory is not short for it.
    b.submit(request("I", tokens(0, 3), 8, priority=1))
    assert b.step() == [("B", 1), ("I", 3)]
    assert b.running() == ["B", "I"]
    for _ in range(5):
        assert b.step() == [("B", 1), ("I", 1)]
    assert b.pool.available == 0
    # I needs a third block: B, though admitted first, is the one preempted (interactive
    # sequences sort as older: inference/engine/sequence.py `age`), and its recomputation
    # takes what the token budget has left (8 - 1).
    b_seq, i_seq = b.seq("B"), b.seq("I")
    assert b.step() == [("I", 1), ("B", 7)]
    assert b_seq.preempted and not i_seq.preempted
    assert (b_seq.computed, len(b_seq.tokens)) == (7, 7)
    assert len(i_seq.blocks) == 3 and len(b_seq.blocks) == 2


# -- 3. chunked prefill -----------------------------------------------------------------------


def test_a_long_prompt_is_prefilled_in_pieces_beside_the_decoding_rows() -> None:
    b = Bench(num_blocks=16, max_step_tokens=6)
    b.submit(request("A", tokens(0, 3), 8))
    assert b.step() == [("A", 3)]
    b.submit(request("B", tokens(10, 18), 3), request("C", tokens(40, 6), 2))
    # Every step: A's token first, then the budget's other 5 tokens to the oldest prompt.
    assert b.step() == [("A", 1), ("B", 5)]
    long, short = b.seq("B"), b.seq("C")
    assert (long.computed, len(long.blocks), long.tokens) == (5, 2, [])
    assert b.step() == [("A", 1), ("B", 5)]
    assert b.step() == [("A", 1), ("B", 5)]
    assert (long.computed, len(long.blocks), long.tokens) == (15, 4, [])
    assert short.computed == 0
    # B's last 3 prompt tokens, then C's first 2: the budget is shared oldest first.
    assert b.step() == [("A", 1), ("B", 3), ("C", 2)]
    assert (long.computed, len(long.blocks), long.tokens) == (18, 5, [TOKEN])
    assert b.step() == [("A", 1), ("B", 1), ("C", 4)]
    assert b.step() == [("A", 1), ("B", 1), ("C", 1)]
    assert b.finished == ["B", "C"]
    assert b.step() == [("A", 1)]
    assert b.finished == ["B", "C", "A"]


# -- 4. priority ------------------------------------------------------------------------------


def test_an_interactive_request_goes_ahead_and_parks_the_youngest_batch_request() -> None:
    b = Bench(num_blocks=20, max_batch_size=2)
    b.submit(request("X", tokens(0, 3), 6), request("Y", tokens(10, 3), 6))
    assert b.step() == [("X", 3), ("Y", 3)]
    assert b.step() == [("X", 1), ("Y", 1)]
    # Both rows are taken; Z (batch) arrives first, I (interactive) then, and goes ahead of it.
    b.submit(request("Z", tokens(20, 3), 3))
    b.submit(request("I", tokens(30, 5), 3, priority=1))
    assert b.waiting() == ["I", "Z"]
    y = b.seq("Y")
    # I takes the row of Y, the youngest batch request (not X's); Y waits ahead of Z.
    assert b.step() == [("X", 1), ("I", 5)]
    assert b.running() == ["X", "I"]
    assert b.waiting() == ["Y", "Z"]
    assert b.scheduler.waiting[0].parked == [y]
    assert (y.blocks, y.computed, y.tokens, y.preempted) == ([], 0, [TOKEN] * 2, True)
    assert b.step() == [("X", 1), ("I", 1)]
    assert b.step() == [("X", 1), ("I", 1)]
    assert b.finished == ["I"]
    # I's row goes back to Y (computed again: prompt and its 2 tokens), not to Z.
    assert b.step() == [("X", 1), ("Y", 5)]
    assert b.waiting() == ["Z"]
    assert b.step() == [("Y", 1), ("Z", 3)]
    assert b.step() == [("Y", 1), ("Z", 1)]
    assert b.step() == [("Y", 1), ("Z", 1)]
    assert b.finished == ["I", "X", "Y", "Z"]
    assert len(y.tokens) == 6  # what it generated before it was parked counted


def test_a_step_that_prefills_an_interactive_prompt_carries_no_batch_prompt() -> None:
    b = Bench(num_blocks=20, max_step_tokens=8)
    b.submit(request("B", tokens(0, 20), 2))
    assert b.step() == [("B", 8)]
    b.submit(request("I", tokens(30, 6), 2, priority=1))
    # The budget has room for 2 of B's tokens beside I's prompt, but B waits a step.
    assert b.step() == [("I", 6)]
    assert b.step() == [("I", 1), ("B", 7)]
    assert b.finished == ["I"]
    assert b.step() == [("B", 5)]


def test_an_interactive_request_is_admitted_before_older_batch_requests() -> None:
    b = Bench(num_blocks=20, max_batch_size=2)
    b.submit(request("X", tokens(0, 3), 2), request("Y", tokens(10, 3), 2))
    b.submit(request("I", tokens(20, 3), 2, priority=1))
    assert b.waiting() == ["I", "X", "Y"]
    # Two rows: I and the older batch request. X's prompt waits a step: a step that
    # prefills an interactive prompt carries no batch prompt.
    assert b.step() == [("I", 3)]
    assert b.running() == ["I", "X"]
    assert b.waiting() == ["Y"]
    assert b.step() == [("I", 1), ("X", 3)]
    assert b.finished == ["I"]
    assert b.step() == [("X", 1), ("Y", 3)]


def test_a_batch_request_parked_for_an_interactive_one_is_not_readmitted_at_once() -> None:
    b = Bench(num_blocks=5, max_step_tokens=8)  # 4 blocks of 4 tokens
    b.submit(request("B", tokens(20, 3), 8))
    assert b.step() == [("B", 3)]
    batch = b.seq("B")
    b.submit(request("I", tokens(0, 3), 8, priority=1))
    b.admit()
    assert "I" in b.running()
    # Both fit: B keeps its block and its keys. (The running estimate once ignored the room
    # left in B's block, so admit() parked B and readmitted it in the same call, its keys
    # thrown away for nothing.)
    assert not batch.preempted and batch in b.scheduler.running


# -- 5. sliding window ------------------------------------------------------------------------


def test_blocks_out_of_every_layers_window_go_back_while_the_sequence_runs() -> None:
    # The engine passes the window only for a model whose every layer has one (runner.py);
    # the block manager takes it as a number, so no model is needed here. With a window of 6
    # and blocks of 4, the token at position p reads keys p - 5 to p: a block goes back once
    # p - 5 is past its last position (blocks.py `slide`), and its table entry reads block 0.
    windowed = Bench(num_blocks=8, window=6)
    whole = Bench(num_blocks=8)
    for bench in (windowed, whole):
        bench.submit(request("A", tokens(0, 10), 6))

    def books(bench: Bench) -> tuple[int, int, list[int], int]:
        seq = bench.seq("A")
        return seq.computed, seq.slid, list(seq.blocks), bench.pool.available

    for plan, with_window, without in [
        ([("A", 10)], (10, 1, [0, 2, 3], 5), (10, 0, [1, 2, 3], 4)),
        ([("A", 1)], (11, 1, [0, 2, 3], 5), (11, 0, [1, 2, 3], 4)),
        ([("A", 1)], (12, 1, [0, 2, 3], 5), (12, 0, [1, 2, 3], 4)),
        # Position 12 takes a new block (block 1, given back before), position 13 lets
        # block 2 go.
        ([("A", 1)], (13, 2, [0, 0, 3, 1], 5), (13, 0, [1, 2, 3, 4], 3)),
        ([("A", 1)], (14, 2, [0, 0, 3, 1], 5), (14, 0, [1, 2, 3, 4], 3)),
    ]:
        assert windowed.step() == plan
        assert whole.step() == plan
        assert books(windowed) == with_window
        assert books(whole) == without
    seq = windowed.seq("A")
    # What the forward reads: the slid entries point at the zeroed block 0.
    assert windowed.pool.tables.gather([seq], 4).tolist() == [[0, 0, 3, 1]]
    assert windowed.pool.refs[2] == 0 and 2 in windowed.pool.free
    # At its end only the blocks it still held go back (check_books: none twice).
    assert windowed.step() == [("A", 1)]
    assert windowed.finished == ["A"]
    assert windowed.pool.available == 7


# -- 6. prefix sharing ------------------------------------------------------------------------


def test_requests_with_a_common_prompt_prefix_share_its_full_blocks() -> None:
    common = tokens(0, 8)  # two full blocks
    a_prompt, b_prompt = common + tokens(8, 2), common + tokens(40, 3)

    # Without the prefix cache each computes its whole prompt in its own blocks.
    plain = Bench(num_blocks=12, max_step_tokens=32)
    plain.submit(request("A", a_prompt, 3), request("B", b_prompt, 3))
    assert plain.step() == [("A", 10), ("B", 11)]
    assert plain.pool.available == 11 - 3 - 3

    b = Bench(num_blocks=12, max_step_tokens=32, prefix_cache=True)
    b.submit(request("A", a_prompt, 3), request("B", b_prompt, 3))
    # Admitted together: B waits for the blocks A is computing instead of computing them too.
    assert b.step() == [("A", 10)]
    a, bb = b.seq("A"), b.seq("B")
    assert (bb.blocks, bb.computed) == ([], 0)
    assert b.step() == [("A", 1), ("B", 3)]
    assert bb.blocks[:2] == a.blocks[:2]
    assert bb.blocks[2] != a.blocks[2]
    assert [b.pool.refs[block] for block in a.blocks] == [2, 2, 1]
    assert [b.pool.refs[block] for block in bb.blocks] == [2, 2, 1]
    assert b.pool.available == 11 - 3 - 1
    assert (a.owner.cached_tokens, bb.owner.cached_tokens) == (0, 8)
    assert b.step() == [("A", 1), ("B", 1)]
    assert b.finished == ["A"]
    assert [b.pool.refs[block] for block in bb.blocks] == [1, 1, 1]
    assert b.step() == [("B", 1)]
    assert b.pool.available == 11

    # The prefix outlives both requests: a later prompt reads it from the cache.
    (c,) = b.submit(request("C", common + tokens(50, 1), 1))
    assert b.step() == [("C", 1)]
    assert c.cached_tokens == 8


def test_the_choices_of_a_request_share_its_prompt_and_copy_a_shared_block_to_write() -> None:
    b = Bench(num_blocks=12, max_step_tokens=32)
    b.submit(request("A", tokens(0, 10), 4, n=2))
    assert b.step() == [("A", 10)]  # one prefill for both choices
    first, second = b.seq("A"), b.seq("A/1")
    assert first.blocks == second.blocks == [1, 2, 3]
    assert b.pool.refs[1:4] == [2, 2, 2]
    assert b.pool.available == 8
    # Position 10 lies in block 3, shared: choice 0 writes into a copy of it, choice 1 then
    # holds the original alone.
    assert b.step() == [("A", 1), ("A/1", 1)]
    assert (first.blocks, second.blocks) == ([1, 2, 4], [1, 2, 3])
    assert b.pool.refs[1:5] == [2, 2, 1, 1]
    assert b.pool.available == 7
    assert b.step() == [("A", 1), ("A/1", 1)]
    assert b.step() == [("A", 1), ("A/1", 1)]
    assert b.finished == ["A", "A/1"]
    assert b.pool.available == 11
