"""Structured-output schemas over HTTP: a schema no finite value matches is refused at upload
(docs/API.md "Structured outputs") and nothing is stored; a recursive schema with a way out is
accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from files.models import File
from tests.conftest import Api, jsonl, request_line
from tests.files.test_validation import ENDING_SCHEMAS, ENDLESS_SCHEMAS, json_schema_format

pytestmark = pytest.mark.django_db


def tool(schema: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": schema}}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (
            lambda schema: {"response_format": json_schema_format(schema)},
            "body.response_format.json_schema.schema",
        ),
        (
            lambda schema: {"tools": [tool(schema)], "tool_choice": "required"},
            "body.tools[0].function.parameters",
        ),
    ],
    ids=["response_format", "tools"],
)
@pytest.mark.parametrize("schema", ENDLESS_SCHEMAS.values(), ids=ENDLESS_SCHEMAS)
def test_a_schema_no_finite_value_matches_is_a_400_and_stores_nothing(
    api: Api, catalog_model, tmp_path: Path, schema, fields, field
):
    response = api.upload(jsonl(request_line("ok"), request_line("endless", **fields(schema))))

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_input_file"
    (detail,) = error["details"]
    assert (detail["line"], detail["field"], detail["code"]) == (2, field, "invalid_parameter")
    assert File.objects.count() == 0
    assert not any((tmp_path / "content").rglob("*.enc"))


@pytest.mark.parametrize("schema", ENDING_SCHEMAS.values(), ids=ENDING_SCHEMAS)
def test_a_recursive_schema_that_can_end_is_uploaded(api: Api, catalog_model, schema):
    rows = [
        request_line("format", response_format=json_schema_format(schema, strict=True)),
        request_line("tool", tools=[tool(schema)], tool_choice="required"),
    ]

    response = api.upload(jsonl(*rows))

    assert response.status_code == 200, response.content
    assert File.objects.get(id=response.json()["id"]).line_count == 2


@pytest.mark.parametrize(
    ("dialect", "fields", "field", "says"),
    [
        ("plain", {"tools": [tool({"type": "object"})]}, "body.tools", "no tool-call syntax"),
        ("plain", {"reasoning_effort": "low"}, "body.reasoning_effort", "no reasoning setting"),
        ("hermes", {"reasoning_effort": "high"}, "body.reasoning_effort", "no reasoning setting"),
        ("harmony", {"reasoning_effort": "none"}, "body.reasoning_effort", "low, medium, high"),
    ],
)
def test_a_field_the_models_dialect_cannot_honour_is_a_400_naming_it_and_stores_nothing(
    api: Api, catalog_model, tmp_path: Path, dialect, fields, field, says
):
    catalog_model.revision.dialect = dialect
    catalog_model.revision.save()

    response = api.upload(jsonl(request_line("ok"), request_line("bad", **fields)))

    assert response.status_code == 400
    (detail,) = response.json()["error"]["details"]
    assert (detail["line"], detail["field"], detail["code"]) == (2, field, "unsupported_parameter")
    assert catalog_model.name in detail["message"] and says in detail["message"]
    assert File.objects.count() == 0
    assert not any((tmp_path / "content").rglob("*.enc"))


def test_reasoning_effort_is_uploaded_for_a_model_that_takes_it(api: Api, catalog_model):
    catalog_model.revision.dialect = "qwen3"
    catalog_model.revision.save()
    response = api.upload(jsonl(request_line("think", reasoning_effort="none")))
    assert response.status_code == 200, response.content
