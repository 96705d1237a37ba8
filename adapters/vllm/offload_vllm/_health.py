"""Liveness and readiness answered off the event loop, on a port of their own.

`OFFLOAD_VLLM_HEALTH_PORT` starts a small HTTP server in a daemon thread of
the API server process (`HealthServer`), bound to vLLM's `--host` (all
interfaces when vLLM has none, as vLLM binds), which answers two paths from
what the event loop last published (`HealthState`):

- `GET /health` (liveness): 200 while the loop turned within
  `OFFLOAD_VLLM_HEALTH_MAX_STALL` seconds and the engine's last check found it
  alive; else 503. A busy loop still turns (offload keeps it free), so a
  server under load stays alive to its probe; a loop blocked for real stops
  publishing, and is reported once the bound has passed.
- `GET /ready` (readiness): 503 while admission would refuse a unit of cost
  in the default lane (a bound is full), during shutdown (from SIGTERM until
  the process ends, while vLLM drains), and while liveness fails; else 200.

Both answer a JSON body: `status`, the `reason` of a 503, and the ages of
what they read. The loop's side (`keep_current`) is one task that wakes every
`PUBLISH_INTERVAL_S`: it writes the time it ran, whether admission refuses,
and, every `ENGINE_CHECK_INTERVAL_S`, the result of vLLM's own engine check
(the one vLLM's `/health` awaits). The health thread only reads those plain
attributes (each written in one assignment by the loop's thread, so a reader
sees the old value or the new one); it never calls into the loop's objects,
and an answer is a few dozen bytecodes, so it holds the GIL for microseconds.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, final

import anyio

import offload

from ._admission_view import refuses_default_lane
from ._seams import engine as engine_seam

logger = logging.getLogger("vllm.offload_vllm")

#: How often the loop publishes its state: readiness follows admission to
#: within this (a refusal lasts at least as long as one request's render, tens
#: of ms), and 40 wake-ups a second cost the loop a few hundredths of a percent.
PUBLISH_INTERVAL_S = 0.025

#: How often the loop runs vLLM's engine check (a flag read on vLLM's
#: `AsyncLLM`): a dead engine is reported within this plus a probe period.
ENGINE_CHECK_INTERVAL_S = 1.0

#: A probe's connection that sends nothing is dropped after this (seconds): a
#: probe sends its request at once; a client that does not holds the next one up.
REQUEST_TIMEOUT_S = 1.0


@final
class HealthState:
    """What the loop publishes and the health thread reads: plain values, each
    written by the loop's thread alone (`keep_current`), read as they are."""

    __slots__ = ("draining", "engine_checked_at", "engine_error", "loop_turned_at", "max_stall", "refusing")

    def __init__(self, max_stall: float) -> None:
        self.max_stall = max_stall
        # Until the loop first publishes, count from now: a loop that never
        # starts the task is reported once the bound has passed.
        self.loop_turned_at = time.monotonic()
        self.engine_checked_at = 0.0
        self.engine_error: str | None = None
        self.refusing = False
        self.draining = False

    def liveness(self, now: float) -> tuple[int, dict[str, Any]]:
        """`(status code, body)` of `GET /health` at `time.monotonic()` `now`."""
        stalled = now - self.loop_turned_at
        body: dict[str, Any] = {
            "loop_turned_seconds_ago": round(stalled, 3),
            "engine_checked_seconds_ago": round(now - self.engine_checked_at, 3) if self.engine_checked_at else None,
        }
        if stalled > self.max_stall:
            reason = f"the event loop has not turned for {stalled:.1f}s (bound {self.max_stall:g}s)"
        elif self.engine_error is not None:
            reason = f"the engine is not alive: {self.engine_error}"
        else:
            return 200, {"status": "ok", **body}
        return 503, {"status": "unhealthy", "reason": reason, **body}

    def readiness(self, now: float) -> tuple[int, dict[str, Any]]:
        """`(status code, body)` of `GET /ready` at `time.monotonic()` `now`."""
        code, body = self.liveness(now)
        if code != 200:
            return code, {**body, "status": "not ready"}
        if self.draining:
            return 503, {**body, "status": "not ready", "reason": "shutting down"}
        if self.refusing:
            return 503, {
                **body,
                "status": "not ready",
                "reason": "admission refuses new requests in the default lane (a bound is full)",
            }
        return 200, {**body, "status": "ready"}


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S
    # HTTP/1.0: one answer per connection, then close (no thread waits on an
    # idle keep-alive connection); the answer is written with one send.
    wbufsize = 4096

    def do_GET(self) -> None:
        answer = {"/health": HealthState.liveness, "/ready": HealthState.readiness}.get(self.path.split("?", 1)[0])
        if answer is None:
            code, body = 404, {"status": "not found", "paths": ["/health", "/ready"]}
        else:
            code, body = answer(self.server.state, time.monotonic())
        payload = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        # Probes every few seconds: not worth a log line each.
        return


class _Server(http.server.HTTPServer):
    """One probe at a time, on the server's own thread: each answer is a few
    dozen bytecodes, and every thread started or woken costs a wait for the
    GIL, which under a GIL-bound flood is what a probe's time is made of
    (measured: four spinning threads, slowest of 50 probes 0.44 s with a
    thread per connection). A client that connects and sends nothing holds
    it for `REQUEST_TIMEOUT_S` at most."""

    # A restarted server must get its port back at once (the connections of
    # the last one's probes may linger in TIME_WAIT).
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: HealthState) -> None:
        self.state = state
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A probe that hung up (or timed out) is no error of the server's.
        return


@final
class HealthServer:
    """The health endpoints' HTTP server, in a daemon thread of its own."""

    def __init__(self, host: str, port: int, state: HealthState, setting: str) -> None:
        """Binds `host:port` now. Raises `OSError` whose message names
        `setting` when the port cannot be had (taken, not allowed)."""
        self.state = state
        try:
            self._server = _Server((host, port), state)
        except OSError as exc:
            raise OSError(exc.errno, f"{setting}={port}: cannot listen on {host}:{port} for the health endpoints: {exc.strerror or exc}") from exc
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="offload-vllm-health", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _mark_draining_on_sigterm(state: HealthState) -> None:
    """Make SIGTERM mark `state` draining, keeping what SIGTERM did before.

    vLLM handles SIGTERM through the event loop (`loop.add_signal_handler`,
    which takes the signal through asyncio's wake-up file descriptor: the
    Python-level handler it sets does nothing), so a Python-level handler set
    over it runs beside it, not instead. Called on the main thread; the
    handler is set again whenever something replaced it."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if getattr(current, "__offload_vllm__", False):
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        state.draining = True
        if callable(current):
            current(signum, frame)

    on_sigterm.__offload_vllm__ = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, on_sigterm)


async def keep_current(
    state: HealthState,
    executor_of: Callable[[], offload.Executor | None],
    engine_client: Any,
) -> None:
    """Publish the loop's turns, admission's refusals and the engine's health
    into `state`, forever (a task on the API server's loop; cancel it to stop)."""
    engine_due = 0.0
    while True:
        now = time.monotonic()
        state.loop_turned_at = now
        executor = executor_of()
        state.refusing = executor is not None and refuses_default_lane(executor)
        _mark_draining_on_sigterm(state)
        if now >= engine_due:
            engine_due = now + ENGINE_CHECK_INTERVAL_S
            error: str | None = None
            try:
                with anyio.fail_after(state.max_stall):
                    await engine_seam.check_health(engine_client)
            except TimeoutError:
                error = f"its health check did not answer within {state.max_stall:g}s"
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            state.engine_error = error
            state.engine_checked_at = time.monotonic()
        await anyio.sleep(PUBLISH_INTERVAL_S)


@final
class Health:
    """The health endpoints of one API server: the thread's server, bound when
    vLLM builds its app, and the loop's task, started when the first pooling
    entrypoint is built (with the engine client, inside the loop)."""

    def __init__(self, port: int, max_stall: float, setting: str) -> None:
        self.state = HealthState(max_stall)
        self._port = port
        self._setting = setting
        self.server: HealthServer | None = None
        self._task: Any = None

    def bind(self, host: str | None) -> None:
        """Listen on `host` (`None` or empty: every interface), once."""
        if self.server is None:
            self.server = HealthServer(host or "0.0.0.0", self._port, self.state, self._setting)
            logger.info(
                "offload-vllm: health endpoints /health and /ready on %s:%d",
                host or "0.0.0.0",
                self.server.port,
            )

    def watch(self, executor_of: Callable[[], offload.Executor | None], engine_client: Any) -> None:
        """Start the loop's task (once; on the running loop)."""
        import asyncio

        with contextlib.suppress(RuntimeError):  # no running loop: offline use
            loop = asyncio.get_running_loop()
            if self._task is None or self._task.done():
                self._task = loop.create_task(
                    keep_current(self.state, executor_of, engine_client), name="offload-vllm-health"
                )
