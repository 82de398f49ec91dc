"""Start a production worker process: Dramatiq on the Redis broker, plus the sweeper."""

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from boardwalk.worker_runtime import WorkerRuntime


class Command(BaseCommand):
    help = "Run a worker process (generation, finalization, sweeps) until SIGTERM/SIGINT."

    def add_arguments(self, parser):
        parser.add_argument("--threads", type=int, default=None)
        parser.add_argument("--sweep-interval", type=float, default=None)

    def handle(self, *args, threads=None, sweep_interval=None, **options):
        if not settings.REDIS_URL:
            raise CommandError(
                "run_worker needs REDIS_URL: without a broker the worker runs inside "
                "`manage.py serve` (the embedded default)."
            )
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        runtime = WorkerRuntime(threads=threads, sweep_interval=sweep_interval).start()
        self.stdout.write("worker ready", ending="\n")
        self.stdout.flush()
        stop.wait()
        runtime.stop()
