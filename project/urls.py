from django.contrib import admin
from django.urls import include, path

from project.views import healthz, metrics_view, readyz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    # The staff console's own pages first: the admin's catch-all would answer them 404.
    path("admin/", include("console.urls")),
    path("admin/", admin.site.urls),
    path("v1/", include("project.api_urls")),
]

handler400 = "boardwalk.errors.handler400"
handler403 = "boardwalk.errors.handler403"
handler404 = "boardwalk.errors.handler404"
handler500 = "boardwalk.errors.handler500"
