"""The process strategy's slots: each maps the calls it takes onto one worker process.

A slot is a thread of the parent (`Dispatcher`); it owns one `WorkerProcess`
at a time, sends it calls one by one, and replaces it when it dies, is
killed, or is retired.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any, final

from .._call import SHUTDOWN, Call
from .._errors import OffloadError, WorkerCrashed, initializer_failed
from .._metrics import count_worker_restart
from .._portable import by_reference, rebuild_error
from .._worker_lifecycle import replace_worker
from . import _encoding, _wire
from ._child_handle import InitializerRaised, StartTimedOut, WorkerProcess


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker process of one pool is started with."""

    name: str
    initializer: Callable[..., Any] | None
    initargs: tuple[Any, ...]
    threshold: int | None
    max_tasks: int | None
    max_memory: int | None
    nice: int
    start_timeout: float | None


def _picklable(value: object) -> bool:
    try:
        pickle.dumps(value, protocol=5)
    except Exception:
        return False
    return True


def _pickling_error(call: Call[Any], exc: BaseException) -> TypeError:
    """Find what could not be pickled and say so."""
    parts = (
        (f"function {call.fn!r}", call.fn),
        *((f"argument {i} ({type(a).__name__})", a) for i, a in enumerate(call.args)),
        *((f"keyword argument {k!r} ({type(v).__name__})", v) for k, v in call.kwargs.items()),
    )
    culprit = next((label for label, value in parts if not _picklable(value)), "the call")
    error = TypeError(
        f"process strategy: {culprit} cannot be pickled, so it cannot be sent to a worker "
        f"process ({type(exc).__name__}: {exc}); pass module-level functions and picklable values"
    )
    error.__cause__ = exc
    return error


@final
class ProcessSlot:
    """One slot's state. `worker`, `killed` and `sent` change under `ProcessSlotWorker.lock`."""

    __slots__ = ("express", "killed", "number", "sent", "tasks", "worker")

    def __init__(self, number: int, *, express: bool = False) -> None:
        self.number = number
        #: The express slot: its worker keeps this process's priority.
        self.express = express
        self.worker: WorkerProcess | None = None
        #: offload killed (or is killing) its worker on purpose.
        self.killed = False
        #: Its current call was sent to the worker (killing the worker now stops it).
        self.sent = False
        self.tasks = 0


@final
class ProcessSlotWorker:
    """The per-slot part of the process strategy (an `offload.strategy.SlotWorker`)."""

    def __init__(self, strategy: Any, config: WorkerConfig) -> None:
        self._strategy = strategy  # for `count_worker_restart` (its name)
        self.config = config
        self.lock = threading.Lock()
        #: Set by `shutdown`: a dead worker is not replaced any more.
        self.stopping = False
        #: Set by `terminate`: every worker is killed, even one still starting.
        self.terminating = False
        self._context: BaseContext | None = None
        self._alive: Connection | None = None

    def prepare(self, context: BaseContext, alive: Connection) -> None:
        """The start method's context, and the pipe end whose closing tells
        every worker that this process is gone."""
        self._context, self._alive = context, alive

    # ---- the worker's lifecycle -----------------------------------------------

    def new_slot(self, number: int) -> ProcessSlot:
        return ProcessSlot(number)

    def new_express_slot(self, number: int) -> ProcessSlot:
        return ProcessSlot(number, express=True)

    def worker_ready(self, slot: ProcessSlot) -> bool:
        worker = slot.worker
        return worker is not None and not slot.killed and worker.alive()

    def start_worker(self, slot: ProcessSlot) -> None:
        if slot.worker is not None:
            # It died (or was killed) while idle: not this call's fault.
            self._forget(slot)
        assert self._context is not None
        assert self._alive is not None
        config = self.config
        try:
            worker = WorkerProcess.spawn(
                self._context,
                f"{config.name}-worker",
                (self._alive, config.initializer, config.initargs, config.threshold,
                 config.max_memory, 0 if slot.express else config.nice),
                lambda started: self._register(slot, started),
            )
        except BaseException as exc:  # EMFILE, no memory: this call fails, the next one retries
            failure = OffloadError(f"process strategy: could not start a worker: {exc!r}")
            failure.__cause__ = exc
            raise failure from exc
        try:
            worker.wait_ready(config.start_timeout)
        except StartTimedOut as exc:
            self._drop(slot)
            doing = (
                f"its initializer {config.initializer!r} still running"
                if config.initializer is not None
                else "its interpreter still starting"
            )
            raise OffloadError(
                f"process strategy: {exc} ({doing}), so it was killed; raise "
                "worker_start_timeout if starting a worker takes that long"
            ) from None
        except InitializerRaised as exc:
            self._drop(slot)
            raise initializer_failed(config.initializer, exc.error) from exc.error
        except WorkerCrashed as exc:
            self._drop(slot)
            # It died while starting (killed, out of memory): a crash, as if under a call.
            raise WorkerCrashed(f"{exc} while starting") from exc
        except BaseException as exc:
            self._drop(slot)
            failure = OffloadError(f"process strategy: could not start a worker: {exc!r}")
            raise failure from exc

    def _register(self, slot: ProcessSlot, worker: WorkerProcess) -> None:
        with self.lock:
            slot.worker, slot.tasks, slot.killed = worker, 0, False
            if self.terminating:
                slot.killed = True
                worker.kill()

    def _drop(self, slot: ProcessSlot) -> None:
        with self.lock:
            slot.worker = None

    def _forget(self, slot: ProcessSlot) -> None:
        worker = slot.worker
        if worker is not None:
            worker.reap()
            count_worker_restart(self._strategy, "killed" if slot.killed else "crashed")
        self._drop(slot)

    def stop_worker(self, slot: ProcessSlot) -> None:
        worker = slot.worker
        if worker is not None:
            worker.stop()
        self._drop(slot)

    def _replace(self, slot: ProcessSlot, reason: str) -> None:
        """Start a fresh process now, so the pool is back to full strength before
        the next call needs it (a failure here is retried by that call)."""
        if slot.worker is not None:
            slot.worker.reap()
        self._drop(slot)
        if not (self.stopping or self.terminating):
            replace_worker(self._strategy, self, slot, reason)

    # ---- killing, from other threads ----------------------------------------------

    def kill_running(self, slot: ProcessSlot, call: Call[Any], reason: str) -> None:
        """Stop `call`, which `slot` took: kill its worker if the call was sent,
        else make sure it is never sent."""
        with self.lock:
            call.stop(reason)
            if slot.sent and slot.worker is not None:
                slot.killed = True
                slot.worker.kill()

    def terminate(self, running: list[tuple[ProcessSlot, Call[Any]]], slots: list[ProcessSlot]) -> None:
        """Kill every worker now, starting ones included; their calls are stopped for shutdown."""
        with self.lock:
            self.terminating = True
            for _, call in running:
                call.stop(SHUTDOWN)
            for slot in slots:
                if slot.worker is not None:
                    slot.killed = True
                    slot.worker.kill()

    # ---- one call ---------------------------------------------------------------

    def run(self, slot: ProcessSlot, call: Call[Any]) -> None:
        config = self.config
        worker = slot.worker
        assert worker is not None
        try:
            data, buffers = _encoding.dumps(
                (
                    by_reference(call.fn),
                    tuple(_encoding.wrap_bytes(a, config.threshold) for a in call.args),
                    {k: _encoding.wrap_bytes(v, config.threshold) for k, v in call.kwargs.items()},
                ),
                config.threshold,
            )
        except Exception as exc:
            call.set_exception(_pickling_error(call, exc))
            return
        with self.lock:
            # Its owner went away after the claim, before this point (or the
            # pool is being torn down): it must not start.
            doomed = call.stopped_by is not None or self.terminating
            slot.sent = not doomed
        if doomed:
            call.set_exception(OffloadError("the call was stopped before it started"))
            return
        try:
            worker.send(data, buffers)
            del data, buffers
            reply = worker.receive()
        except _wire.ArenaError as exc:
            # This process could not make the shared memory (out of file
            # descriptors, say): nothing was sent, the worker is fine.
            error = OffloadError(f"process strategy: the call's arguments could not be sent: {exc}")
            error.__cause__ = exc.__cause__
            call.set_exception(error)
            return
        except _wire.StreamBroken as exc:
            error = OffloadError(
                f"process strategy: the worker's reply was lost ({exc}); the worker was replaced"
            )
            error.__cause__ = exc.__cause__
            call.set_exception(error)
            worker.abandon()
            self._replace(slot, "crashed")
            return
        except (WorkerCrashed, OSError) as exc:
            crash = exc if isinstance(exc, WorkerCrashed) else worker.crashed()
            name = getattr(call.fn, "__qualname__", None) or repr(call.fn)
            reason = "killed" if slot.killed else "crashed"
            call.set_exception(WorkerCrashed(f"{crash} while running {name}()"))
            self._replace(slot, reason)
            return
        finally:
            with self.lock:
                slot.sent = False
        status, value, retire = reply
        del reply
        slot.tasks += 1
        if status == "ok":
            call.set_result(value)
        else:
            call.set_exception(rebuild_error(value))
        del value
        if retire or (config.max_tasks is not None and slot.tasks >= config.max_tasks):
            worker.stop()
            self._replace(slot, "retired")
