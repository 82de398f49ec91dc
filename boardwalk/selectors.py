from __future__ import annotations

from boardwalk.errors import NotFound
from boardwalk.models import Organization


def organization_by_id_or_name(ident: str) -> Organization:
    org = (
        Organization.objects.filter(id=ident).first()
        or Organization.objects.filter(name=ident).first()
    )
    if org is None:
        raise NotFound(f"No organization with id or name {ident!r}.")
    return org
