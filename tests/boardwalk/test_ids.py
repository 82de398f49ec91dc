"""Opaque ids: random ones are well formed and spread over the alphabet; derived ones stable."""

from __future__ import annotations

import re
from collections import Counter

from boardwalk.ids import _ALPHABET, derived_id, new_id


def test_new_ids_are_prefixed_well_formed_and_distinct() -> None:
    made = [new_id("req_") for _ in range(20_000)]

    assert all(re.fullmatch(r"req_[A-Za-z0-9]{24}", i) for i in made)
    assert len(set(made)) == len(made)
    assert len(new_id("x", length=40)) == 41


def test_every_position_of_a_new_id_draws_from_the_whole_alphabet() -> None:
    made = [new_id("", length=24) for _ in range(20_000)]

    for position in (0, 11, 23):  # the lowest, a middle and the highest digit
        counts = Counter(i[position] for i in made)
        assert set(counts) == set(_ALPHABET)
        expected = len(made) / len(_ALPHABET)  # ~323 each
        assert max(counts.values()) < 1.4 * expected and min(counts.values()) > 0.6 * expected


def test_derived_ids_are_stable_across_versions() -> None:
    # Rows found again by a retried step carry these ids: the derivation must never change.
    assert derived_id("row_", "batch_x", "3") == "row_M1rbKPbWlv1IVFMdLabN0u8Y"
