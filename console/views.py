"""Staff console pages. Each is wrapped by `admin.site.admin_view` (boardwalk/urls.py):
active staff only, everyone else is sent to the admin login. Ids, counts and money only."""

from __future__ import annotations

import csv
from typing import Any

from chartkick.django import BarChart, ColumnChart, LineChart, PieChart
from django.contrib import admin
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from console.selectors import (
    SUMS,
    Period,
    UsageDashboard,
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


def _charts(d: UsageDashboard) -> dict[str, Any]:
    tokens = [
        {"name": name, "data": {r.label: getattr(r, attr) for r in d.series}}
        for name, attr in (
            ("input", "input_tokens"),
            ("cached", "cached_tokens"),
            ("output", "output_tokens"),
        )
    ]
    return {
        "tokens": LineChart(tokens, height="260px"),
        # Columns are categories, not a time axis: short labels read better than ISO times.
        "gpu": ColumnChart(
            {
                r.key.strftime("%m-%d %H:00" if d.period.hourly else "%Y-%m-%d"): round(
                    r.gpu_seconds, 3
                )
                for r in d.series
            },
            height="260px",
        ),
        "spend": LineChart(
            [{"name": org, "data": data} for org, data in d.spend_series_by_org.items()],
            height="260px",
        ),
        "spend_by_model": BarChart({r.label: r.spend_microusd for r in d.by_model}, height="220px"),
        "statuses": PieChart(d.batches_by_status, height="220px", donut=True),
        "failures": BarChart(d.failure_codes, height="220px"),
    }


def usage_view(request: HttpRequest) -> HttpResponse:
    dashboard = _dashboard(request)
    context = {
        **admin.site.each_context(request),
        "title": "Usage"
        + (f": {dashboard.org.name}" if dashboard.org is not None else ": all organizations"),
        "d": dashboard,
        "charts": _charts(dashboard),
        "periods": list(Period),
        "query": request.GET.urlencode(),
    }
    return TemplateResponse(request, "admin/console/usage.html", context)


CSV_COLUMNS = ("org_id", "model", "revision_id", "deployment_id", *SUMS)


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
        revision_id, deployment_id = row.key
        writer.writerow(
            [
                *bounds,
                row.org_id,
                row.label.split(" · ", 1)[-1],
                revision_id,
                deployment_id,
                *(getattr(row, c) for c in CSV_COLUMNS[4:]),
            ]
        )
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
