"""The web tier never imports torch or the engine: acceptance is database work."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

_PROBE = """
import json, sys, django
django.setup()
from django.urls import get_resolver
get_resolver().url_patterns  # import every view module the URL conf names
import batches.services, batches.views, files.views, files.counting, files.tasks
from inference.chat_completions import prompt_ids
from inference.tokenization import chat_tokenizer_for
print(json.dumps(sorted(m for m in ("torch", "transformers") if m in sys.modules)))
"""


def test_importing_the_web_url_conf_does_not_import_torch():
    env_probe = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=ROOT,
        env={"DJANGO_SETTINGS_MODULE": "project.settings", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert env_probe.returncode == 0, env_probe.stderr[-2000:]
    assert json.loads(env_probe.stdout.strip().splitlines()[-1]) == []


def test_web_token_counts_equal_the_workers(catalog_model):
    """The torch-free tokenizer gives exactly the worker's (transformers') prompt ids."""
    from inference.chat_completions import prompt_ids
    from inference.prompt_bounds import bounded_prompt_ids, prompt_token_counts
    from inference.runtime import tokenizer_for
    from inference.tokenization import chat_tokenizer_for

    revision = catalog_model.revision
    bodies = [
        {"messages": [{"role": "user", "content": "Hello there"}]},
        {
            "messages": [
                {"role": "system", "content": "Be brief. <|im_end|> is text here"},
                {"role": "user", "content": [{"type": "text", "text": "Why is the sky blue?"}]},
                {"role": "assistant", "content": "Rayleigh."},
                {"role": "user", "content": "  And at sunset?\n\n"},
            ]
        },
        {
            # Tools render through the template's tojson: the same (plain JSON) on both sides.
            "messages": [{"role": "user", "content": "Weather in <Paris> & Zürich?"}],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "Weather for a city <b>now</b> & 'later'",
                        "parameters": {
                            "type": "object",
                            "properties": {"city": {"type": "string"}},
                            "required": ["city"],
                        },
                    },
                }
            ],
        },
    ]
    web = chat_tokenizer_for(revision)
    worker = tokenizer_for(revision)
    for body in bodies:
        assert prompt_ids(web, body) == prompt_ids(worker, body)
        # The prepare stage renders, measures, then encodes: the same ids as the template's.
        for tokenizer in (web, worker):
            assert bounded_prompt_ids(tokenizer, body, context_length=2048) == prompt_ids(
                worker, body
            )
    # Acceptance and the background count encode a file's prompts in batches: the same counts.
    assert prompt_token_counts(web, bodies) == [len(prompt_ids(worker, b)) for b in bodies]
    assert prompt_token_counts(worker, bodies) == [len(prompt_ids(worker, b)) for b in bodies]
