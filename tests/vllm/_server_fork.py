"""Test servers forked from one process that has imported vLLM already.

Half of a test server's start is one interpreter importing torch, Transformers
and vLLM (about 12 CPU-seconds of the 24 here), and the suite starts dozens of
servers on two cores. So `start_server` asks one long-lived process of the
session (the *forker*, this file run as a script) to fork each server from
itself after that import, instead of starting a new interpreter each time.

What a forked server shares with a fresh one, and what it does not:

- The forker imports vLLM's OpenAI server module and nothing of offload: vLLM
  reads its settings (`vllm.envs`) when they are used and loads its plugins
  (offload's adapter) in `serve`, so the adapter, its settings and its
  patches are made in the server, from the server's environment, as in a
  fresh process. No plugin is loaded in the forker (`start` checks it).
- A setting that a library reads once at import time is the forker's, not
  the server's: the suite's servers differ in `OFFLOAD_*`, `VLLM_*` and
  `OTEL_*` variables only, none read at import; `PYTHONPATH` entries are put
  at the front of `sys.path`.
- `/proc/PID/environ` shows the forker's environment, not the server's
  (`os.environ` is right).
- The forker's one extra native thread (numpy's BLAS pool) does not come
  through `fork`; BLAS starts it again in the child.

A fresh interpreter for every server is one variable away:
`OFFLOAD_TEST_FRESH_SERVERS=1`. The start of a fresh server as a new user
runs it is tested on its own (test_startup.py, test_config.py), not forked.

The protocol, one JSON object per line: the test process writes
`{"argv", "env", "cwd", "log"}` to the forker's stdin; the forker answers
`{"pid"}` on its stdout, and later `{"exited": pid, "code"}` when that server
ends (its exit status as `subprocess.Popen.returncode` gives it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

#: A fresh interpreter for each server, not a fork (any non-empty value but "0").
FRESH_ENV = "OFFLOAD_TEST_FRESH_SERVERS"

#: What the forker imports before it forks anything.
PRELOAD = ("torch", "transformers", "vllm.entrypoints.cli.serve", "vllm.entrypoints.openai.api_server")


class ForkedProcess:
    """What `Server` uses of `subprocess.Popen`, for a process that the forker,
    not this one, is the parent of: its exit status comes from the forker."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class Forker:
    """The session's forker: started at the first `start`, ended with the session."""

    def __init__(self, common_env: dict[str, str]) -> None:
        self._common_env = common_env
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._children: dict[int, ForkedProcess] = {}
        self._answers: list[dict[str, Any]] = []
        self._answered = threading.Condition()
        self._gone: str | None = None

    def start(self, argv: list[str], env: dict[str, str], log: Path) -> ForkedProcess:
        """Fork a server running `python ARGV[1:]` (`argv[0]` is the
        interpreter) in a session of its own, stdout and stderr to `log`."""
        assert argv[1] == "-m", argv
        with self._lock:
            proc = self._ensure_started()
            assert proc.stdin is not None
            request = {"argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log)}
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()
            pid = int(self._next_answer("pid")["pid"])
            child = ForkedProcess(pid, argv)
            self._children[pid] = child
            self._flush_early_exits()
            return child

    def _ensure_started(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            self._proc = subprocess.Popen(
                [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                env={**os.environ, **self._common_env},
            )
            threading.Thread(target=self._read, args=(self._proc.stdout,), name="server-forker-reader", daemon=True).start()
            ready = self._next_answer("ready")
            assert ready["plugins_loaded"] is False, "the forker loaded vLLM's plugins: servers would share them"
        return self._proc

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            message = json.loads(line)
            with self._answered:
                self._answers.append(message)
                self._answered.notify_all()
        with self._answered:
            self._gone = "the server forker ended"
            self._answered.notify_all()

    def _next_answer(self, key: str) -> dict[str, Any]:
        with self._answered:
            while True:
                for i, message in enumerate(self._answers):
                    if key in message:
                        return self._answers.pop(i)
                self._deliver_exits()
                if self._gone is not None:
                    raise RuntimeError(self._gone)
                self._answered.wait(1.0)

    def _deliver_exits(self) -> None:
        # Called with `_answered` held.
        for message in [m for m in self._answers if "exited" in m and m["exited"] in self._children]:
            self._answers.remove(message)
            self._children.pop(message["exited"])._set_exit(int(message["code"]))

    def _flush_early_exits(self) -> None:
        with self._answered:
            self._deliver_exits()

    def watch(self) -> None:
        """Deliver exit statuses as they come (a thread of the session)."""
        with self._answered:
            while self._gone is None:
                self._deliver_exits()
                self._answered.wait(1.0)
            self._deliver_exits()

    def close(self) -> None:
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(timeout=30)


_forker: Forker | None = None
_forker_lock = threading.Lock()


def forked(argv: list[str], env: dict[str, str], log: Path, common_env: dict[str, str]) -> ForkedProcess | None:
    """`argv` forked from the session's forker, or `None` where servers are
    to start fresh (`OFFLOAD_TEST_FRESH_SERVERS`). The forker, started at the
    first call, runs with this process's environment and `common_env` (what
    every server's has, such as `HF_HUB_OFFLINE`, which libraries read at import)."""
    global _forker
    if os.environ.get(FRESH_ENV, "0") not in ("", "0"):
        return None
    with _forker_lock:
        if _forker is None:
            _forker = Forker(common_env)
            threading.Thread(target=_forker.watch, name="server-forker-exits", daemon=True).start()
    return _forker.start(argv, env, log)


# ---- the forker's side (this file run as a script) --------------------------


def _child(request: dict[str, Any], inherited: tuple[int, ...]) -> None:
    """In the forked child: become the server `request` names. Never returns."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(-1)
        for fd in inherited:
            os.close(fd)
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]  # as `python -m` puts it
        os.environ.clear()
        os.environ.update(request["env"])
        for entry in reversed([p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        argv = request["argv"]
        sys.argv = [argv[2], *argv[3:]]
        import runpy

        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve() -> None:
    import importlib
    import selectors

    sys.path[0] = os.getcwd()  # as `python -m` puts it, not this file's directory
    for module in PRELOAD:
        importlib.import_module(module)
    import vllm.plugins

    out = sys.stdout.buffer
    lock = threading.Lock()

    def say(message: dict[str, Any]) -> None:
        with lock:
            out.write(json.dumps(message).encode() + b"\n")
            out.flush()

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the session; the forker ends at EOF
    say({"ready": True, "plugins_loaded": vllm.plugins.plugins_loaded})

    requests = sys.stdin.buffer
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    buffered = b""
    while True:
        for key, _ in selector.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                continue
            chunk = os.read(requests.fileno(), 65536)
            if not chunk:
                return
            buffered += chunk
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    _child(request, (wake_r, wake_w))
                say({"pid": pid})
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            say({"exited": pid, "code": -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)})


if __name__ == "__main__":
    _serve()
