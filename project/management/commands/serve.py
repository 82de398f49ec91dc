"""Serve the API with gunicorn; on the embedded default, run the worker in-process too.

The worker class is `project.server.BoundedThreadWorker`: gunicorn's threaded worker with
request heads read on the event loop and every body read bounded in time, so slow or idle
clients cannot hold the threads other requests need (docs/DEPLOYMENT.md).
"""

from django.conf import settings
from django.core.management.base import BaseCommand
from gunicorn.app.base import BaseApplication

from boardwalk.broker import is_embedded
from boardwalk.env import env_int


class _Gunicorn(BaseApplication):
    def __init__(self, options: dict) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self):
        from project.wsgi import application

        return application


def _start_embedded_worker(worker) -> None:
    from project.worker_runtime import WorkerRuntime

    worker.boardwalk_runtime = WorkerRuntime().start()


class Command(BaseCommand):
    help = "Serve the API (gunicorn). Without REDIS_URL, also runs the worker in this process."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--workers", type=int, default=None)
        # Threads serve requests whose headers are complete; slow heads wait on the event loop.
        parser.add_argument("--threads", type=int, default=None)

    def handle(self, *args, host, port, workers, threads, **options):
        embedded = is_embedded()
        options = {
            "bind": f"{host}:{port}",
            # Embedded: one process, so the in-process worker and SQLite have a single owner.
            "workers": 1 if embedded else (workers or env_int("BOARDWALK_WEB_PROCESSES", 2)),
            "threads": threads or settings.HTTP_THREADS,
            "worker_class": "project.server.BoundedThreadWorker",
            # Connections a process holds at once (heads being read, requests, keep-alive);
            # beyond it, new ones wait in the listen backlog.
            "worker_connections": settings.HTTP_MAX_CONNECTIONS,
            "backlog": 256,
            "keepalive": 5,
            # The arbiter's liveness check of each process; request reads have their own limits.
            "timeout": 60,
            "graceful_timeout": 20,
            "limit_request_line": 8190,
            "limit_request_fields": 100,
            "limit_request_field_size": 8190,
            # gunicorn's control socket lives at one fixed path per user; not needed here.
            "control_socket_disable": True,
            "accesslog": "-",
            "access_log_format": '%(h)s "%(r)s" %(s)s %(b)s %(L)ss',
            "post_worker_init": _start_embedded_worker if embedded else None,
        }
        if not embedded:
            options.pop("post_worker_init")
        mode = "embedded (SQLite + in-process worker)" if embedded else "production"
        self.stdout.write(
            f"Boardwalk serving on http://{host}:{port}/v1 — {mode}; data in {settings.DATA_DIR}"
        )
        _Gunicorn(options).run()
