"""Money arithmetic in integer micro-USD (SPEC §8). Prices are per million tokens."""

from __future__ import annotations

from dataclasses import dataclass

PER_MILLION = 1_000_000


@dataclass(frozen=True)
class TokenPrices:
    input: int
    cached_input: int
    output: int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def token_charge(prices: TokenPrices, *, prompt: int, cached: int, completion: int) -> int:
    """(prompt - cached)·input + cached·cached_input + completion·output, per million tokens.

    Rounded half-up per request; a batch's charge is the sum of its requests' charges, so
    receipts always add up to the batch.
    """
    numerator = (
        (prompt - cached) * prices.input + cached * prices.cached_input + completion * prices.output
    )
    return (numerator + PER_MILLION // 2) // PER_MILLION


def token_hold(prices: TokenPrices, *, prompt: int, max_output: int) -> int:
    """The most a request can cost: every prompt token uncached, every output token used."""
    return _ceil_div(prompt * prices.input + max_output * prices.output, PER_MILLION)


def gpu_charge(*, seconds: float, price_per_second: int) -> int:
    return round(seconds * price_per_second)
