"""The layer contracts (pyproject's [tool.importlinter]) fail on an upward import and name it.

lint-imports runs on a copy of the packages with two forbidden imports added, so the real
tree is never touched: the core importing an app, and the CLI importing Django.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _copy_packages(into: Path) -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for package in config["root_packages"]:
        shutil.copytree(
            ROOT / package,
            into / package,
            # Only the sources: the import graph is read from them.
            ignore=lambda _, names: [n for n in names if n == "__pycache__" or n.endswith(".pyc")],
        )
    shutil.copy(ROOT / "pyproject.toml", into / "pyproject.toml")


def test_an_upward_import_breaks_the_contracts_with_the_import_named(tmp_path: Path):
    _copy_packages(tmp_path)
    (tmp_path / "boardwalk" / "_layer_probe.py").write_text("import batches.models\n")
    (tmp_path / "boardwalk_cli" / "_layer_probe.py").write_text("import django.conf\n")

    result = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        # lint-imports reads the packages from its working directory, ahead of the installed
        # ones, and pyproject.toml from there too.
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Layers import downwards only" in out and "BROKEN" in out
    assert "boardwalk._layer_probe -> batches.models" in out
    assert "The CLI is an HTTP client: no Django, no core, no app BROKEN" in out
    assert "boardwalk_cli._layer_probe -> django (l.1)" in out  # external: its top package
    # The unchanged contracts still hold: only the two probes broke anything.
    assert "The engine is a library: no Django, no app KEPT" in out
    assert (ROOT / "boardwalk" / "_layer_probe.py").exists() is False
