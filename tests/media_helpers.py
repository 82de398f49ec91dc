"""Media for tests, made on the spot: images with Pillow, audio with numpy + soundfile, and a
local HTTPS server with a self-signed certificate (trusted through configuration only)."""

from __future__ import annotations

import base64
import datetime as dt
import io
import ipaddress
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
from PIL import Image

from tests.conftest import request_line


def image_bytes(seed: int = 0, *, size: tuple[int, int] = (40, 32), fmt: str = "PNG") -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    if fmt == "GIF":  # an animation: the first frame is the one that counts
        frames = [Image.fromarray(pixels), Image.fromarray(255 - pixels)]
        frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    else:
        Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def audio_bytes(
    seconds: float = 1.0, *, fmt: str = "WAV", rate: int = 22_050, seed: int = 0
) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    tone = 0.3 * np.sin(2 * np.pi * (220 + 40 * seed) * t).astype(np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, tone, rate, format=fmt)
    return buffer.getvalue()


def image_row(
    custom_id: str,
    url: str,
    *,
    model: str = "boardwalk/tiny-vision",
    text: str = "What is this?",
    max_tokens: int = 6,
) -> dict[str, Any]:
    parts = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
    return request_line(custom_id, model=model, max_tokens=max_tokens, content=parts, temperature=0)


def audio_row(
    custom_id: str,
    data: bytes,
    fmt: str,
    *,
    model: str = "boardwalk/tiny-audio",
    max_tokens: int = 6,
) -> dict[str, Any]:
    audio = {"data": base64.b64encode(data).decode(), "format": fmt}
    parts = [{"type": "text", "text": "Transcribe:"}, {"type": "input_audio", "input_audio": audio}]
    return request_line(custom_id, model=model, max_tokens=max_tokens, content=parts, temperature=0)


@dataclass
class LocalHttps:
    port: int
    ca_file: Path
    requests: list[str] = field(default_factory=list)

    scheme: str = "https"

    def url(self, path: str, host: str = "localhost") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"


def _self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@contextmanager
def https_server(
    directory: Path,
    routes: dict[str, Callable[[], tuple[int, dict[str, str], bytes]]],
    *,
    tls: bool = True,
) -> Iterator[LocalHttps]:
    """Serve `routes` (path → (status, headers, body)) over HTTPS on 127.0.0.1 (plain HTTP
    with `tls=False`)."""
    cert_file, key_file = _self_signed(directory)
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            route = routes.get(self.path)
            status, headers, body = route() if route else (404, {}, b"not here")
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield LocalHttps(server.server_address[1], cert_file, seen, "https" if tls else "http")
    finally:
        server.shutdown()
        server.server_close()
