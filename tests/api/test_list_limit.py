"""`limit` on the list endpoints takes exactly what /v1/openapi.json says: an integer 1 to 100."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.conftest import Api

LISTS = ("/v1/batches", "/v1/requests")


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize(
    "raw",
    [
        "",  # `limit=` with no value: the SDK never sends it, so it is a caller's bug
        "0",
        "101",
        "-1",
        "+5",
        " 5",
        "1_0",
        "5.0",
        "\u0665",  # ARABIC-INDIC DIGIT FIVE: a digit to str.isdigit and int(), not to the schema
        "1" * 5000,  # past int()'s digit limit
    ],
)
def test_a_limit_outside_1_to_100_or_not_plain_digits_is_refused(api: Api, path: str, raw: str):
    response = api.get(path, QUERY_STRING=f"limit={quote(raw)}")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_limit", "limit")


@pytest.mark.parametrize("path", LISTS)
def test_limit_bounds_and_the_default_are_accepted(api: Api, path: str):
    for query in ("limit=1", "limit=100", "limit=007", ""):
        response = api.get(path, QUERY_STRING=query)
        assert response.status_code == 200, (query, response.content)
        assert response.json()["object"] == "list"
