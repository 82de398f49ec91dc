"""Start a production worker process: Dramatiq on the Redis broker, plus the sweeper.

`--device D` pins this process's engines to one device (one worker per GPU); `--devices
all|LIST` starts and supervises one such process per device (project.worker_supervisor).
"""

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from project.worker_supervisor import DeviceError, Supervisor, device_check, devices_parse


class Command(BaseCommand):
    help = "Run a worker process (generation, finalization, sweeps) until SIGTERM/SIGINT."

    def add_arguments(self, parser):
        parser.add_argument("--threads", type=int, default=None)
        parser.add_argument("--sweep-interval", type=float, default=None)
        where = parser.add_mutually_exclusive_group()
        where.add_argument(
            "--device", default=None, help="cpu, cuda or cuda:N (default: cuda if visible)."
        )
        where.add_argument(
            "--devices",
            default=None,
            help="all (one worker per visible GPU) or a list such as cuda:0,cuda:1: starts "
            "and supervises one worker process per device.",
        )

    def handle(self, *args, threads=None, sweep_interval=None, device=None, devices=None, **_):
        try:
            chosen = device_check(device) if device else None
            supervised = devices_parse(devices) if devices else None
        except DeviceError as exc:
            raise CommandError(str(exc)) from exc
        if not settings.REDIS_URL:
            raise CommandError(
                "run_worker needs REDIS_URL: without a broker the worker runs inside "
                "`manage.py serve` (the embedded default)."
            )
        stop = threading.Event()
        if supervised is not None:
            extra = [] if threads is None else ["--threads", str(threads)]
            if sweep_interval is not None:
                extra += ["--sweep-interval", str(sweep_interval)]
            supervisor = Supervisor(supervised, extra_args=extra)
            signal.signal(signal.SIGTERM, lambda *_: supervisor.stopped.set())
            signal.signal(signal.SIGINT, lambda *_: supervisor.stopped.set())
            self.stdout.write(f"supervising workers on {', '.join(supervised)}", ending="\n")
            self.stdout.flush()
            if supervisor.run():
                raise CommandError("every device's worker kept failing; see the log above")
            return
        if chosen:
            settings.ENGINE_DEVICE = chosen
        # Imported here: the supervisor above never loads the worker runtime.
        from project.worker_runtime import WorkerRuntime

        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        runtime = WorkerRuntime(threads=threads, sweep_interval=sweep_interval).start()
        self.stdout.write("worker ready", ending="\n")
        self.stdout.flush()
        stop.wait()
        runtime.stop()
