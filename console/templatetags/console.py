from django import template

register = template.Library()


@register.filter
def usd(microusd: int) -> str:
    """µUSD as dollars for reading; the integer beside it is the exact figure."""
    return f"${microusd / 1_000_000:,.6f}"
