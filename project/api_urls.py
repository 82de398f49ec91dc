"""Every public endpoint under /v1 (each view declares its scopes:
docs/API.md "Identifiers, keys and scopes")."""

from django.urls import path

from batches import views as batches
from batches.interactive import views as interactive
from boardwalk.http.openapi import OpenApiView
from files import views as files
from inference import views as inference
from webhooks import views as webhooks

urlpatterns = [
    path("openapi.json", OpenApiView.as_view(), name="openapi"),
    path("files", files.FileCollectionView.as_view(), name="files"),
    path("files/<str:file_id>", files.FileDetailView.as_view(), name="file"),
    path("files/<str:file_id>/content", files.FileContentView.as_view(), name="file-content"),
    path("chat/completions", interactive.ChatCompletionsView.as_view(), name="chat-completions"),
    path("batches", batches.BatchCollectionView.as_view(), name="batches"),
    path("batches/estimate", batches.BatchEstimateView.as_view(), name="batch-estimate"),
    path("batches/<str:batch_id>", batches.BatchDetailView.as_view(), name="batch"),
    path("batches/<str:batch_id>/cancel", batches.BatchCancelView.as_view(), name="batch-cancel"),
    path("requests", batches.ReceiptListView.as_view(), name="requests"),
    path("requests/<str:request_id>", batches.ReceiptDetailView.as_view(), name="request"),
    path("models", inference.ModelListView.as_view(), name="models"),
    path("models/<path:name>", inference.ModelDetailView.as_view(), name="model"),
    path(
        "webhook_endpoints",
        webhooks.WebhookEndpointCollectionView.as_view(),
        name="webhook-endpoints",
    ),
    path(
        "webhook_endpoints/<str:endpoint_id>",
        webhooks.WebhookEndpointDetailView.as_view(),
        name="webhook-endpoint",
    ),
    path(
        "webhook_endpoints/<str:endpoint_id>/rotate_secret",
        webhooks.WebhookEndpointRotateSecretView.as_view(),
        name="webhook-endpoint-rotate-secret",
    ),
    path(
        "webhook_endpoints/<str:endpoint_id>/test",
        webhooks.WebhookEndpointTestView.as_view(),
        name="webhook-endpoint-test",
    ),
    path(
        "webhook_event_types",
        webhooks.WebhookEventTypeListView.as_view(),
        name="webhook-event-types",
    ),
]
