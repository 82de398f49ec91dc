"""Usage dashboard benchmark (issue 11): render /admin/usage/ over 1M metering events.

Seeds `--events` UsageEvent rows (default 1,000,000: a quarter as many item attempts times
the four kinds) spread over the last 30 days, across 20 organizations and 4 models, through the
product's own write path (`billing.metering.usage_record` in groups of 500 item attempts,
each group at its own moment, so the hourly rollup is maintained exactly as the record
stage maintains it), plus settled spend per group. Then, as a staff user through the Django
test client, renders the dashboard for each period: one warm-up, then the median of `--runs`.

For comparison it also times the aggregate the dashboard would need without the rollup: one
GROUP BY day, organization and kind over the raw events of the month.

    .venv/bin/python benchmarks/usage.py                       # SQLite (embedded default)
    DATABASE_URL=postgres://…/scratch DJANGO_SECRET_KEY=… BOARDWALK_MASTER_KEYS=… \\
      BOARDWALK_API_KEY_PEPPER=… .venv/bin/python benchmarks/usage.py    # PostgreSQL

The database named by DATABASE_URL is migrated and filled; use a scratch one. Without it a
fresh SQLite file in a temporary directory is used.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

GROUP = 500  # item attempts per usage_record call (the record stage writes ≤ 64)
ORGS = 20
MODELS = 4


def _timed(fn, runs: int) -> tuple[float, list[float]]:
    fn()  # warm-up: connections, template loading, the database's caches
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--reuse",
        metavar="DIR",
        help="time again on the SQLite data dir of an earlier run (PostgreSQL: BENCH_REUSE=1)",
    )
    args = parser.parse_args()
    scratch = args.reuse or tempfile.mkdtemp(prefix="bw-usage-bench-")
    if not os.environ.get("DATABASE_URL"):
        os.environ["BOARDWALK_DATA_DIR"] = scratch

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection, transaction

    from billing.metering import UsageFacts, spend_record, usage_record
    from billing.models import UsageEvent, UsageRollup
    from boardwalk import clock
    from boardwalk.models import Organization
    from boardwalk.services import org_create
    from inference.models import ModelRevision

    call_command("migrate", verbosity=0)
    engine = "PostgreSQL" if settings.IS_POSTGRES else "SQLite"
    if args.reuse or (settings.IS_POSTGRES and os.environ.get("BENCH_REUSE")):
        orgs = list(Organization.objects.values_list("id", flat=True))
        _time_pages(args, engine, orgs, scratch)
        return
    if UsageEvent.objects.exists():
        sys.exit("the database already holds usage events: use a scratch database")

    orgs = [org_create(name=f"bench-org-{i}").id for i in range(ORGS)]
    revisions = [
        ModelRevision.objects.create(label=f"bench-{i}", weights="/nonexistent", context_length=1)
        for i in range(MODELS)
    ]
    rng = random.Random(11)
    attempts = args.events // 4
    now = clock.now()
    started = time.perf_counter()
    item_id = 0
    for _ in range(0, attempts, GROUP):
        # Each group lands at its own moment in the last 30 days.
        at = now - dt.timedelta(seconds=rng.randrange(30 * 24 * 3600))
        facts = []
        for _ in range(GROUP):
            item_id += 1
            org = rng.choice(orgs)
            revision = rng.choice(revisions).id
            deployment = "dep_bench" if revision == revisions[0].id else ""
            prompt = rng.randrange(20, 2000)
            facts.append(
                UsageFacts(
                    org_id=org,
                    batch_id=f"batch_bench{item_id // 100}",
                    item_id=item_id,
                    attempt=1,
                    revision_id=revision,
                    deployment_id=deployment,
                    outcome="succeeded",
                    prompt_tokens=prompt,
                    cached_tokens=rng.randrange(1, prompt),
                    completion_tokens=rng.randrange(1, 500),
                    gpu_microseconds=rng.randrange(1_000, 900_000),
                )
            )
        with clock.travel(at - now), transaction.atomic():
            usage_record(facts=facts)
            spend_record(
                org_id=facts[0].org_id,
                revision_id=facts[0].revision_id,
                deployment_id=facts[0].deployment_id,
                amount_microusd=rng.randrange(1, 1_000_000),
                at=clock.now(),
            )
    seed_s = time.perf_counter() - started
    if settings.IS_POSTGRES:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    events = UsageEvent.objects.count()
    rollups = UsageRollup.objects.count()
    print(f"{engine}: seeded {events:,} events ({rollups:,} rollup rows) in {seed_s:.0f} s")
    _time_pages(args, engine, orgs, scratch)


def _time_pages(args: argparse.Namespace, engine: str, orgs: list[str], scratch: str) -> None:
    from django.contrib.auth.models import User
    from django.db.models import Sum
    from django.db.models.functions import TruncDay
    from django.test import Client

    from billing.models import UsageEvent, UsageRollup
    from boardwalk import clock

    events, rollups = UsageEvent.objects.count(), UsageRollup.objects.count()
    print(f"{engine}: {events:,} events, {rollups:,} rollup rows")

    client = Client()
    staff = User.objects.filter(username="bench-staff").first()
    client.force_login(staff or User.objects.create_superuser("bench-staff", "", "unused"))

    def render(period: str, org: str = "") -> None:
        query = f"?period={period}" + (f"&org={org}" if org else "")
        response = client.get(f"/admin/usage/{query}")
        assert response.status_code == 200, response.status_code

    for label, fn in (
        ("dashboard, month", lambda: render("month")),
        ("dashboard, week", lambda: render("week")),
        ("dashboard, day", lambda: render("day")),
        ("dashboard, month, one org", lambda: render("month", orgs[0])),
        ("CSV export, month", lambda: client.get("/admin/usage.csv?period=month")),
    ):
        median, times = _timed(fn, args.runs)
        print(f"  {label:28s} median {median:7.1f} ms   runs {[round(t) for t in times]}")

    def raw_group_by() -> None:
        list(
            UsageEvent.objects.filter(created_at__gte=clock.now() - dt.timedelta(days=30))
            .annotate(day=TruncDay("created_at"))
            .values("day", "org_id", "kind")
            .annotate(total=Sum("quantity"))
        )

    median, times = _timed(raw_group_by, min(args.runs, 5))
    label = "raw GROUP BY over events"
    print(f"  {label:28s} median {median:7.1f} ms   runs {[round(t) for t in times]}")
    print(f"  ({len(orgs)} orgs, {MODELS} models, scratch {scratch})")


if __name__ == "__main__":
    main()
