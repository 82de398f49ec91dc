from __future__ import annotations

from itertools import chain
from typing import Any

from django.http import HttpResponse, StreamingHttpResponse
from rest_framework.exceptions import UnsupportedMediaType
from rest_framework.response import Response
from rest_framework.views import APIView

from boardwalk.auth import READ, WRITE
from boardwalk.broker import send_after_commit
from boardwalk.codes import ErrorCode
from boardwalk.errors import InvalidRequest, MethodNotAllowed
from boardwalk.http import openapi as oa
from files import schemas
from files.counting import file_count_on_upload
from files.multipart import MultipartError, multipart_boundary
from files.ranges import not_modified, requested_range
from files.selectors import file_get_for_org, file_readable_for_org
from files.serializers import file_payload
from files.services import file_create_from_upload, file_delete, file_read_range
from files.tasks import file_count_tokens
from files.upload import ReceivedForm, upload_receive
from files.validation import ModelLookupError, ModelTarget
from inference.selectors import ModelNotUsable, model_resolve


def _resolver(org: Any) -> Any:
    def resolve(name: str) -> ModelTarget:
        try:
            target = model_resolve(org=org, name=name)
        except ModelNotUsable as exc:
            raise ModelLookupError(exc.code, exc.message) from exc
        return ModelTarget(
            name=name,
            context_length=target.revision.context_length,
            media=target.batch_media,
            dialect=target.revision.dialect,
        )

    return resolve


class FileCollectionView(APIView):
    """POST /v1/files uploads; there is deliberately no listing (GET answers 405)."""

    scopes = {"POST": WRITE, "GET": READ}
    # upload_receive streams the body and refuses an oversized one itself (413).
    reads_own_body = True

    @property
    def allowed_methods(self) -> list[str]:
        # What OPTIONS and every answer's Allow header list: the methods that answer. GET
        # (and HEAD with it) exists only to say there is no listing.
        return ["POST", "OPTIONS"]

    @oa.not_served()
    def get(self, request: Any) -> Response:
        raise MethodNotAllowed(
            "There is no file-list endpoint; keep the ids returned by uploads and batches.",
        )

    @oa.operation(
        schemas.FILE,
        errors=(409, 413, 415, 429),
        request={"multipart/form-data": schemas.FILE_UPLOAD},
    )
    def post(self, request: Any) -> Response:
        # The body is read here, as it streams, not by DRF's parsers (request.data is unused).
        content_type = request.META.get("CONTENT_TYPE", "")
        try:
            boundary = multipart_boundary(content_type)
        except MultipartError as exc:
            raise InvalidRequest(str(exc), code=ErrorCode.INVALID_MULTIPART) from None
        if boundary is None:
            raise UnsupportedMediaType(
                content_type,
                detail="Send the upload as multipart/form-data with the fields 'purpose' "
                "and 'file'.",
            )
        form = upload_receive(
            request._request.read,
            boundary=boundary,
            content_length=_content_length(request.META),
            resolver=_resolver(request.user.org),
        )
        try:
            return Response(file_payload(self._store(request, form)))
        finally:
            form.discard()

    def _store(self, request: Any, form: ReceivedForm) -> Any:
        upload = form.upload
        if form.unexpected:
            unknown = sorted(set(form.unexpected))
            raise InvalidRequest(
                f"Unsupported upload field(s): {', '.join(unknown)}. Send only 'purpose=batch' "
                "and 'file', once each; input files expire 24 hours after upload unless a batch "
                "uses them.",
                code=ErrorCode.UNSUPPORTED_FIELD,
                param=unknown[0],
            )
        if upload is None:
            raise InvalidRequest(
                "Attach the JSONL file as the multipart field 'file'.",
                code=ErrorCode.MISSING_FILE,
                param="file",
            )
        purpose = form.text.get("purpose")
        if not purpose:
            raise InvalidRequest(
                "Send the multipart field 'purpose=batch'.",
                code=ErrorCode.MISSING_PURPOSE,
                param="purpose",
            )
        file = file_create_from_upload(org=request.user.org, purpose=purpose, upload=upload)
        # A small file's prompt tokens are counted here, a larger one's by a worker, off the
        # upload's answer (files.counting); sent from here because files.tasks reads files
        # through files.services.
        if not file_count_on_upload(file=file):
            send_after_commit(file_count_tokens, file.id)
        return file


def _content_length(meta: dict[str, Any]) -> int | None:
    try:
        return int(meta.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None


class FileDetailView(APIView):
    scopes = {"GET": READ, "DELETE": WRITE}

    @oa.operation(schemas.FILE)
    def get(self, request: Any, file_id: str) -> Response:
        return Response(file_payload(file_get_for_org(org=request.user.org, file_id=file_id)))

    @oa.operation(oa.DELETED, errors=(409,))
    def delete(self, request: Any, file_id: str) -> Response:
        file = file_get_for_org(org=request.user.org, file_id=file_id)
        file_delete(file=file)
        return Response({"id": file.id, "object": "file", "deleted": True})


class FileContentView(APIView):
    scopes = {"GET": READ}

    @oa.operation(None, errors=(416,), ok_content_type="application/jsonl")
    def get(self, request: Any, file_id: str) -> HttpResponse | StreamingHttpResponse:
        file = file_readable_for_org(org=request.user.org, file_id=file_id)
        if not_modified(
            if_match=request.headers.get("If-Match"),
            if_none_match=request.headers.get("If-None-Match"),
            etag=file.etag,
        ):
            unchanged = HttpResponse(status=304)
            unchanged["ETag"] = file.etag
            return unchanged
        span = requested_range(
            range_header=request.headers.get("Range"),
            if_range=request.headers.get("If-Range"),
            etag=file.etag,
            size=file.bytes,
        )
        start, end = span if span is not None else (0, file.bytes - 1)
        pieces = file_read_range(file=file, start=start, end=end) if file.bytes else iter(())
        # Decrypt (and authenticate) the first piece before answering, so a tampered file
        # fails with a clean 500 rather than a truncated 200.
        first = next(pieces, b"")
        response = StreamingHttpResponse(
            chain([first], pieces),
            content_type="application/jsonl",
            status=206 if span is not None else 200,
        )
        response["Content-Length"] = str(end - start + 1 if file.bytes else 0)
        response["ETag"] = file.etag
        response["Accept-Ranges"] = "bytes"
        response["Content-Disposition"] = f'attachment; filename="{file.filename}"'
        if span is not None:
            response["Content-Range"] = f"bytes {start}-{end}/{file.bytes}"
        return response
