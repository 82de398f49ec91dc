"""Mounted under /admin/ before the admin's own URLs; every view is staff-only."""

from django.contrib import admin
from django.urls import path

from console import views

urlpatterns = [
    path("usage/", admin.site.admin_view(views.usage_view), name="console-usage"),
    path("usage.csv", admin.site.admin_view(views.usage_csv_view), name="console-usage-csv"),
    path("workers/", admin.site.admin_view(views.workers_view), name="console-workers"),
]
