"""Money arithmetic in integer micro-USD (docs/BILLING.md "One rounding rule"). Prices are per
million tokens.

One rounding rule for money (docs/BILLING.md): every amount is an exact integer numerator
divided once, rounded half up (`money_div`), per request. Holds use the same rule: it is
monotone, so a hold computed from bigger counts is never below the charge of smaller ones.
"""

from __future__ import annotations

from dataclasses import dataclass

PER_MILLION = 1_000_000


@dataclass(frozen=True)
class TokenPrices:
    input: int
    cached_input: int
    output: int


MICROSECONDS_PER_SECOND = 1_000_000


def money_div(numerator: int, denominator: int) -> int:
    """numerator / denominator rounded half up: THE rounding rule for money."""
    return (numerator + denominator // 2) // denominator


def token_charge(prices: TokenPrices, *, prompt: int, cached: int, completion: int) -> int:
    """(prompt - cached)·input + cached·cached_input + completion·output, per million tokens.

    Rounded half-up per request; a batch's charge is the sum of its requests' charges, so
    receipts always add up to the batch.
    """
    numerator = (
        (prompt - cached) * prices.input + cached * prices.cached_input + completion * prices.output
    )
    return money_div(numerator, PER_MILLION)


def token_hold(prices: TokenPrices, *, prompt: int, max_output: int) -> int:
    """The most a request can cost: every prompt token uncached, every output token used."""
    return money_div(prompt * prices.input + max_output * prices.output, PER_MILLION)


def gpu_charge(*, microseconds: int, price_per_second: int) -> int:
    """GPU time (integer µs, from the usage events) times µUSD per GPU-second."""
    return money_div(microseconds * price_per_second, MICROSECONDS_PER_SECOND)
