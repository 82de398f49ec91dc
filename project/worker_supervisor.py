"""One worker process per device: `run_worker --devices all|cuda:0,cuda:1,...`.

The supervisor starts `manage.py run_worker --device D` for each device, restarts a child that
exits on its own (after a back-off), and on SIGTERM/SIGINT stops them all. A device whose
worker keeps dying soon after it starts (bad driver, a model that cannot load there) is
parked after `MAX_QUICK_FAILURES` in a row instead of being restarted forever; the supervisor
exits non-zero once every device is parked. The children do the work; the supervisor touches
neither the database nor the broker.

Each child is told how many GPUs it owns from its device on (`BOARDWALK_WORKER_GPUS`): up to
the next supervised device, or to the last visible one. A tensor-parallel revision over more
GPUs than that is left to other workers (inference.selectors), so that its ranks never land
on a GPU another child's engine runs on.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:\d+)?)$")
QUICK_FAILURE_SECONDS = 60.0  # a child that dies sooner than this failed "quickly"
MAX_QUICK_FAILURES = 5
MAX_BACKOFF_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 30.0
MANAGE_PY = Path(__file__).resolve().parent.parent / "manage.py"


class DeviceError(ValueError):
    """A device name that this machine does not have; the message says which it has."""


def _cuda_count() -> int:
    import torch  # a worker machine's import: the web process never supervises

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_check(device: str) -> str:
    """`device` if this machine has it, else DeviceError naming what it has."""
    if not DEVICE_PATTERN.match(device):
        raise DeviceError(f"unknown device {device!r}: use cpu, cuda or cuda:N")
    if device == "cpu":
        return device
    count = _cuda_count()
    if count == 0:
        raise DeviceError(f"{device}: no CUDA device is visible on this machine; use cpu")
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        raise DeviceError(f"{device}: this machine has {count} CUDA device(s), cuda:0-{count - 1}")
    return device


def devices_parse(value: str) -> list[str]:
    """`all` (every visible GPU) or a comma-separated list of devices, each checked."""
    if value == "all":
        count = _cuda_count()
        if count == 0:
            raise DeviceError("--devices all: no CUDA device is visible; use --device cpu")
        return [f"cuda:{i}" for i in range(count)]
    devices = [d.strip() for d in value.split(",") if d.strip()]
    if not devices:
        raise DeviceError("--devices takes all or a list such as cuda:0,cuda:1")
    return [device_check(d) for d in devices]


def gpus_owned(devices: list[str], visible: int) -> dict[str, int]:
    """The GPUs each supervised CUDA device's worker owns from its own on: up to the next
    supervised device, the last one up to `visible` (a CPU worker owns none: not listed)."""
    starts = sorted({_index(d) for d in devices if d.startswith("cuda")})
    ends = [*starts[1:], max(visible, starts[-1] + 1)] if starts else []
    span = {start: end - start for start, end in zip(starts, ends, strict=True)}
    return {d: span[_index(d)] for d in devices if d.startswith("cuda")}


def _index(device: str) -> int:
    return int(device.partition(":")[2] or 0)


@dataclass
class _Child:
    device: str
    process: subprocess.Popen | None = None
    started: float = 0.0
    quick_failures: int = 0
    restart_at: float = 0.0
    parked: bool = False
    restarts: int = field(default=0)


class Supervisor:
    def __init__(self, devices: list[str], *, extra_args: list[str]) -> None:
        self.children = [_Child(device) for device in devices]
        self.extra_args = extra_args
        cuda = any(d.startswith("cuda") for d in devices)
        self.owned = gpus_owned(devices, _cuda_count() if cuda else 0)
        self.stopped = threading.Event()

    def _start(self, child: _Child) -> None:
        args = [sys.executable, str(MANAGE_PY), "run_worker", "--device", child.device]
        env = dict(os.environ)
        if child.device in self.owned:
            env["BOARDWALK_WORKER_GPUS"] = str(self.owned[child.device])
        child.process = subprocess.Popen([*args, *self.extra_args], env=env)  # noqa: S603 - our own
        child.started = time.monotonic()
        logger.info("worker started device=%s pid=%s", child.device, child.process.pid)

    def run(self, *, poll_seconds: float = 1.0) -> int:
        """Supervise until stopped (0) or every device is parked (1)."""
        for child in self.children:
            self._start(child)
        while not self.stopped.wait(poll_seconds):
            for child in self.children:
                self._tend(child)
            if all(child.parked for child in self.children):
                logger.error("every device's worker keeps failing; the supervisor gives up")
                return 1
        self._stop_all()
        return 0

    def _tend(self, child: _Child) -> None:
        now = time.monotonic()
        if child.parked:
            return
        if child.process is not None:
            code = child.process.poll()
            if code is None:
                return
            lived = now - child.started
            child.quick_failures = child.quick_failures + 1 if lived < QUICK_FAILURE_SECONDS else 0
            child.process = None
            if child.quick_failures >= MAX_QUICK_FAILURES:
                child.parked = True
                logger.error(
                    "worker on %s failed %s times in a row (exit %s); not restarted",
                    child.device,
                    child.quick_failures,
                    code,
                )
                return
            backoff = min(MAX_BACKOFF_SECONDS, 2.0 ** max(0, child.quick_failures - 1))
            child.restart_at = now + (backoff if child.quick_failures else 0.0)
            logger.warning("worker on %s exited (%s); restarting", child.device, code)
        if now >= child.restart_at:
            child.restarts += 1
            self._start(child)

    def _stop_all(self) -> None:
        running = [c.process for c in self.children if c.process is not None]
        for process in running:
            process.terminate()  # each child hands its leases back and leaves
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        for process in running:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
