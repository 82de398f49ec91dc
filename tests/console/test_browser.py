"""The usage dashboard and the batch list in a real browser: Debian's chromium, driven by
Playwright, at the widths staff use (1280, 1440, 1920 px).

No browser is downloaded (never `playwright install`): the test uses /usr/bin/chromium and
skips when it is absent. `.ci/run` installs the package when it is missing.

Screenshots go to a temporary directory (BOARDWALK_SCREENSHOT_DIR to keep them). The
README's picture, docs/img/usage-dashboard.png, is rewritten only on request:
`BOARDWALK_UPDATE_DOCS_SCREENSHOT=1 pytest tests/console/test_browser.py`.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from batches.sweeps import sweep_work
from billing.metering import UsageFacts, usage_record
from boardwalk import clock
from inference.demo.model import demo_revision_fields
from inference.services import revision_create
from tests.batches.conftest import finalize, rows, submit
from tests.console.conftest import Seeded, run_batch

ROOT = Path(__file__).resolve().parents[2]
DOCS_SCREENSHOT = ROOT / "docs" / "img" / "usage-dashboard.png"
DOCS_WIDTH = 1440
WIDTHS = (1280, 1440, 1920)
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
PASSWORD = "pw-for-the-browser"

pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK), reason="needs Debian's chromium (apt-get install chromium)"
)

# Every cell, label and figure whose text does not fit: wider than its own box, or running
# past the edge of a box that clips or scrolls it (a side table in its card), or past the
# window. Each is reported with its text, so a failure says "2381" was shown for 23818.
CLIPPED_JS = """() => {
  const clipped = [];
  const view = document.documentElement.clientWidth;
  const items = document.querySelectorAll(
    "#content td, #content th, #content label, #content .bw-kpi, #content .bw-kpi b");
  for (const el of items) {
    const box = el.getBoundingClientRect();
    if (!box.width || !el.textContent.trim()) continue;
    let why = "";
    if (el.scrollWidth > el.clientWidth + 1) {
      why = `text ${el.scrollWidth}px in ${el.clientWidth}px`;
    }
    else if (box.right > view + 1) why = `past the window (${Math.round(box.right)} > ${view})`;
    for (let a = el.parentElement; a && !why; a = a.parentElement) {
      if (getComputedStyle(a).overflowX === "visible") continue;
      const edge = a.getBoundingClientRect().left + a.clientLeft + a.clientWidth;
      if (box.right > edge + 1) why = `cut by ${a.id || a.className || a.tagName} at ${edge}px`;
    }
    if (why) clipped.push(`${el.tagName} "${el.textContent.trim().slice(0, 40)}": ${why}`);
  }
  return clipped;
}"""

# What each chart draws: its type and every dataset's points (bars or line points).
CHARTS_JS = """() => Object.values(Chartkick.charts).map(c => {
  const chart = c.getChartObject();
  if (!chart) return {id: c.element.id, type: null, datasets: []};
  return {id: c.element.id, type: chart.config.type, datasets: chart.data.datasets.map(
    d => d.data.map(v => typeof v === "object" && v !== null ? v.y : v))};
})"""


def big_usage(seeded: Seeded, *, item_id: int) -> UsageFacts:
    return UsageFacts(
        org_id=seeded.acme.org.id,
        batch_id=seeded.batches[0].id,
        item_id=item_id,
        attempt=1,
        revision_id=seeded.batches[0].revision_id,
        deployment_id="",
        outcome="succeeded",
        prompt_tokens=23_818,
        cached_tokens=11_909,
        completion_tokens=52_944,
        gpu_microseconds=7_654_321,
    )


@pytest.fixture
def busy(seeded: Seeded, deployment: Any) -> Seeded:
    """The seeded batches, more earlier in the day, a cancelled and an expired batch, and
    five- and six-digit usage (the widths that were cut off: "2381" shown for 23818)."""
    for hours, tenant, body in (
        (20, seeded.acme, {}),
        (15, seeded.globex, {}),
        (9, seeded.acme, {"model": deployment.name}),
        (4, seeded.globex, {}),
    ):
        with clock.travel(-dt.timedelta(hours=hours)):
            run_batch(tenant, 2 + hours % 3, f"earlier-{hours}", **body)
    cancelled = submit(seeded.acme.api, rows(3), key="to-cancel")
    assert seeded.acme.api.post(f"/v1/batches/{cancelled['id']}/cancel").status_code == 200
    assert finalize(cancelled["id"]).status == "cancelled"
    expiring = submit(seeded.globex.api, rows(2), key="to-expire")
    with clock.travel(dt.timedelta(hours=24, seconds=1)):
        sweep_work()
        assert finalize(expiring["id"]).status == "expired"
    submit(seeded.globex.api, rows(2), key="still-running")  # in_progress, never run
    # Big usage in a dozen otherwise quiet hours: more rows than the side tables show at once
    # (they scroll), each row the figures that were cut to "2381" and "5294".
    for n, hours in enumerate((1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13, 14)):
        with clock.travel(-dt.timedelta(hours=hours)):
            usage_record(facts=[big_usage(seeded, item_id=10_000_000 + n)])
    return seeded


@pytest.fixture
def browser(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Chromium, logged in as nobody yet. Request it after the fixtures that write data: the
    ORM calls made inside Playwright's event loop would open a connection of their own that
    nothing closes (PostgreSQL then refuses to drop the test database)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (dev extras)")
    User.objects.create_superuser("browser-staff", "staff@example.com", PASSWORD)
    # Playwright's sync API runs an event loop in this thread; Django must not mistake the
    # ORM calls around it for calls from async code.
    # (monkeypatch: set for this test only, never for the processes later tests start).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    kept = os.environ.get("BOARDWALK_SCREENSHOT_DIR")
    out = Path(kept) if kept else tmp_path / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    return out


def staff_page(browser: Any, live_server: Any, width: int, path: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": width, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("response", lambda r: r.status < 400 or errors.append(f"{r.status} {r.url}"))
    page.goto(f"{live_server.url}/admin/login/?next={path}")
    page.fill("#id_username", "browser-staff")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{path.split('?')[0]}**")
    return page, errors


def charts_drawn(page: Any, drawn: int = 6) -> list[dict[str, Any]]:
    """The six charts once `drawn` of them have data drawn (an empty one draws no canvas)."""
    page.wait_for_function(
        "n => window.Chartkick && Object.keys(Chartkick.charts).length >= 6"
        " && Object.values(Chartkick.charts).filter(c => c.getChartObject()).length >= n",
        arg=drawn,
    )
    return page.evaluate(CHARTS_JS)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_dashboard_draws_every_chart_and_every_number_fits(
    live_server, busy: Seeded, browser, screenshots: Path, width: int
):
    page, errors = staff_page(browser, live_server, width, "/admin/usage/?period=day")
    charts = charts_drawn(page)
    page.screenshot(path=str(screenshots / f"usage-day-{width}.png"), full_page=True)
    assert not errors, errors
    assert [c["type"] for c in charts] == ["line", "bar", "line", "bar", "pie", "bar"]
    # tokens, GPU, spend twice, statuses, failures: every chart has data to draw.
    assert all(any(any((v or 0) > 0 for v in d) for d in c["datasets"]) for c in charts), charts
    # Every hour of the day is a point (25: the hour the window starts in to this one).
    assert {len(points) for points in charts[0]["datasets"] + charts[2]["datasets"]} == {25}
    assert len(charts[1]["datasets"][0]) == 25
    failures = page.locator("#failure-codes td").all_inner_texts()
    assert "batch_cancelled" in failures and "batch_expired" in failures
    assert page.locator("#usage-table tbody tr").count() == 3
    assert page.evaluate(CLIPPED_JS) == []
    # The side table has each of those hours with every digit.
    tokens = page.locator("#tokens-numbers td").all_inner_texts()
    assert tokens.count("23818") == tokens.count("52944") == 12, tokens
    if width == DOCS_WIDTH and os.environ.get("BOARDWALK_UPDATE_DOCS_SCREENSHOT"):
        page.screenshot(path=str(DOCS_SCREENSHOT), full_page=True)
    page.close()


def test_a_week_with_one_day_of_data_draws_the_whole_week(
    live_server, seeded: Seeded, browser, screenshots: Path
):
    """Every time chart has a point per day of the window, zero where nothing ran: one day
    of usage is a bar or a peak in its week, not a lone dot in an empty chart."""
    page, errors = staff_page(browser, live_server, 1440, "/admin/usage/?period=week")
    charts = charts_drawn(page, drawn=5)  # no failures: that chart draws nothing
    assert not errors, errors
    page.screenshot(path=str(screenshots / "usage-week-1440.png"), full_page=True)
    assert page.evaluate(CLIPPED_JS) == []
    tokens, gpu, spend = charts[0], charts[1], charts[2]
    assert (tokens["type"], gpu["type"], spend["type"]) == ("line", "bar", "line")
    for chart in (tokens, gpu, spend):
        # The 7 days before today and today; the seeded usage is on one (two past midnight).
        assert {len(points) for points in chart["datasets"]} == {8}, chart
        assert any(any(points) for points in chart["datasets"]), chart
        for points in chart["datasets"]:
            assert sum(1 for v in points if v) <= 2, chart
    page.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_the_batch_list_shows_every_status_in_full(
    live_server, busy: Seeded, browser, screenshots: Path, width: int
):
    page, errors = staff_page(browser, live_server, width, "/admin/batches/batch/")
    assert not errors, errors
    statuses = set(page.locator("#result_list td.field-status").all_inner_texts())
    assert {"Completed", "Cancelled", "Expired", "In Progress"} <= statuses, statuses
    page.screenshot(path=str(screenshots / f"batches-{width}.png"), full_page=True)
    assert page.evaluate(CLIPPED_JS) == []
    page.close()


# Every card whose content is wider than the card, or which runs past the grid it sits in.
CARDS_OVERFLOWING_JS = """() => {
  const out = [];
  for (const card of document.querySelectorAll("#content .bw-card")) {
    const grid = card.parentElement.getBoundingClientRect();
    const box = card.getBoundingClientRect();
    const title = card.querySelector("h2").textContent;
    if (card.scrollWidth > card.clientWidth + 1) {
      out.push(`${title}: ${card.scrollWidth}px in ${card.clientWidth}px`);
    } else if (box.right > grid.right + 1) out.push(`${title}: past the grid`);
  }
  return out;
}"""

LONG_LABEL = "tiny-chat@/home/operator/models/a-rather-long-checkpoint-directory/2026-12-01/final"


@pytest.mark.parametrize("width", WIDTHS)
def test_long_model_names_stay_inside_their_cards(
    live_server, busy: Seeded, browser, screenshots: Path, width: int
):
    """A model named by nothing but its revision's label (a path by default) is the longest
    name the model charts and tables show: it wraps in the table and stays in its card."""
    weights = busy.batches[0].revision.weights
    revision = revision_create(
        **(demo_revision_fields(Path(weights), "tiny") | {"label": LONG_LABEL})
    )
    usage_record(facts=[replace(big_usage(busy, item_id=30_000_000), revision_id=revision.id)])
    page, errors = staff_page(browser, live_server, width, "/admin/usage/?period=day")
    charts_drawn(page)
    page.screenshot(path=str(screenshots / f"usage-long-names-{width}.png"), full_page=True)
    assert not errors, errors
    assert page.evaluate(CARDS_OVERFLOWING_JS) == []
    assert page.evaluate(CLIPPED_JS) == []
    assert LONG_LABEL in page.locator("#usage-table").inner_text()
    page.close()
