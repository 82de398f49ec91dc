"""Staff console pages. Each is wrapped by `admin.site.admin_view` (project/urls.py):
active staff only, everyone else is sent to the admin login. Ids, counts and money only."""

from __future__ import annotations

import csv
import datetime as dt
from typing import Any

from chartkick.django import ColumnChart, LineChart, PieChart
from django.contrib import admin
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from console.selectors import (
    SUMS,
    Period,
    UsageDashboard,
    UsageRow,
    organization_for_staff,
    usage_dashboard,
    workers_overview,
)


def _dashboard(request: HttpRequest) -> UsageDashboard:
    try:
        period = Period(request.GET.get("period", Period.WEEK))
    except ValueError:
        period = Period.WEEK
    org = None
    if org_id := request.GET.get("org"):
        org = organization_for_staff(org_id=org_id)
        if org is None:
            raise Http404("No such organization.")
    return usage_dashboard(period=period, org=org)


def _column_label(d: UsageDashboard, t: dt.datetime) -> str:
    """A column's short (and unique) label: in the day view the hour, its date where a day
    begins (the window's own dates head the page) and "now" for this hour, whose clock hour
    the window's first column has too; the date in the others."""
    if not d.period.hourly:
        return t.strftime("%m-%d")
    if t == d.buckets[-1]:
        return "now"
    return t.strftime("%H:00" if t.hour else "%m-%d")


def _charts(d: UsageDashboard) -> dict[str, Any]:
    # The time charts draw every point of the window, zero where nothing ran (d.buckets),
    # with straight lines between them: one busy hour or day is a peak in its window, not a
    # lone dot, and a quiet hour reads as zero rather than as a curve's dip below it.
    points = {r.key: r for r in d.series}
    times = [t.isoformat() for t in d.buckets]
    empty = UsageRow(None, "")
    tokens = [
        {
            "name": name,
            "data": {t.isoformat(): getattr(points.get(t, empty), attr) for t in d.buckets},
        }
        for name, attr in (
            ("input", "input_tokens"),
            ("cached", "cached_tokens"),
            ("output", "output_tokens"),
        )
    ]
    line = {"height": "260px", "curve": False}
    # Names go under columns rather than beside bars: the chart library cuts a long name
    # beside a bar at the canvas edge ("t-agent (deployment)"); the table has them in full.
    return {
        "tokens": LineChart(tokens, **line),
        # Columns are categories, not a time axis: short labels read better than ISO times.
        "gpu": ColumnChart(
            [[_column_label(d, t), round(points.get(t, empty).gpu_seconds, 3)] for t in d.buckets],
            height="260px",
        ),
        "spend": LineChart(
            [
                {"name": org, "data": {t: data.get(t, 0) for t in times}}
                for org, data in d.spend_series_by_org.items()
            ],
            **line,
        ),
        "spend_by_model": ColumnChart(
            [[r.label, r.spend_microusd] for r in d.by_model], height="220px"
        ),
        "statuses": PieChart(d.batches_by_status, height="220px", donut=True),
        "failures": ColumnChart(list(d.failure_codes.items()), height="220px"),
    }


def usage_view(request: HttpRequest) -> HttpResponse:
    dashboard = _dashboard(request)
    context = {
        **admin.site.each_context(request),
        "title": "Usage"
        + (f": {dashboard.org.name}" if dashboard.org is not None else ": all organizations"),
        "d": dashboard,
        "time_format": "m-d H:i" if dashboard.period.hourly else "Y-m-d",
        "charts": _charts(dashboard),
        "periods": list(Period),
        "query": request.GET.urlencode(),
    }
    return TemplateResponse(request, "admin/console/usage.html", context)


CSV_COLUMNS = ("org_id", "model", "revision_id", "deployment_id", *SUMS)
# A cell starting with one of these is a formula to a spreadsheet (OWASP, CSV injection):
# names come from operators and tenants' own deployments, so such a text cell is written
# with a leading apostrophe. Numbers are written as numbers (a negative one stays one).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def usage_csv_view(request: HttpRequest) -> HttpResponse:
    dashboard = _dashboard(request)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = (
        f'attachment; filename="usage-{dashboard.period}-{dashboard.end:%Y%m%d%H%M}.csv"'
    )
    writer = csv.writer(response)
    writer.writerow(["period_start", "period_end", *CSV_COLUMNS])
    bounds = [dashboard.start.isoformat(), dashboard.end.isoformat()]
    for row in dashboard.by_org_model:
        # One row per table row (organization and model name); a model served by several
        # revisions over the period names each of them, space-separated.
        revision_ids, deployment_ids = zip(*row.revisions, strict=True)
        cells = [
            *bounds,
            row.org_id,
            row.key,
            " ".join(revision_ids),
            " ".join(dict.fromkeys(d for d in deployment_ids if d)),
            *(getattr(row, c) for c in CSV_COLUMNS[4:]),
        ]
        writer.writerow([_cell(c) for c in cells])
    return response


def workers_view(request: HttpRequest) -> HttpResponse:
    workers = workers_overview()
    context = {
        **admin.site.each_context(request),
        "title": "Workers",
        "workers": workers,
        "alive": sum(w.alive for w in workers),
        "items_per_second": sum(w.items_per_second for w in workers if w.alive),
    }
    return TemplateResponse(request, "admin/console/workers.html", context)
