"""The usage dashboard in a real browser: Debian's chromium, driven by Playwright.

No browser is downloaded (never `playwright install`): the test uses /usr/bin/chromium and
skips when it is absent. `.ci/run` installs the package when it is missing.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from boardwalk import clock
from tests.console.conftest import Seeded, run_batch

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "img" / "usage-dashboard.png"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK), reason="needs Debian's chromium (apt-get install chromium)"
)


def test_the_dashboard_renders_charts_with_data_in_a_browser(
    live_server, seeded: Seeded, deployment, monkeypatch
):
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (dev extras)")
    # A few more batches earlier in the day, so the charts (and the README's screenshot)
    # show usage over time, not a single point.
    for hours, tenant, body in (
        (20, seeded.acme, {}),
        (15, seeded.globex, {}),
        (9, seeded.acme, {"model": deployment.name}),
        (4, seeded.globex, {}),
    ):
        with clock.travel(-dt.timedelta(hours=hours)):
            run_batch(tenant, 2 + hours % 3, f"earlier-{hours}", **body)
    User.objects.create_superuser("browser-staff", "staff@example.com", "pw-for-the-browser")
    # Playwright's sync API runs an event loop in this thread; Django must not mistake the
    # ORM calls around it for calls from async code.
    # (monkeypatch: set for this test only, never for the processes later tests start).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{live_server.url}/admin/login/?next=/admin/usage/%3Fperiod%3Dday")
            page.fill("#id_username", "browser-staff")
            page.fill("#id_password", "pw-for-the-browser")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/usage/**")
            page.wait_for_function(
                # Six charts; the failure-codes one has no data here, so it draws no canvas.
                "() => window.Chartkick && Object.keys(Chartkick.charts).length >= 6"
                " && Object.values(Chartkick.charts).filter(c => c.getChartObject()).length >= 5"
            )
            datasets = page.evaluate(
                """() => Object.values(Chartkick.charts)
                    .map(c => c.getChartObject()).filter(Boolean)
                    .map(chart => chart.data.datasets.map(d => d.data.map(
                        v => typeof v === "object" && v !== null ? v.y : v)))"""
            )
            assert len(datasets) >= 5 and not errors, errors
            non_zero = [any(any((v or 0) > 0 for v in ds) for ds in chart) for chart in datasets]
            assert all(non_zero[:5]), non_zero  # tokens, GPU, spend twice, statuses
            assert page.locator("canvas").count() >= 5
            assert page.locator("#usage-table tbody tr").count() == 3
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
        finally:
            browser.close()
    assert SCREENSHOT.stat().st_size > 10_000
