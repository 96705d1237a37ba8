"""The server-stop path (`_server.servers_started`) fails when offload leaves a
shared-memory file of a stopped server behind.

A stand-in server (no vLLM: a process that answers `/health` on loopback)
makes a real offload arena (`_wire.Sender`, as a `process` strategy's worker
and parent do for large payloads), then is stopped as every test server is.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ._server import Server, free_port, servers_started

_STAND_IN = """
import http.server, os, pickle, signal, sys
from multiprocessing import Pipe
from offload._strategies import _wire

sender = _wire.Sender()
if sys.argv[2] == "cleans-up":
    # A clean shutdown: the arena goes with the process, as offload's own
    # exit path does for its workers' pipes.
    def stop(signum, frame):
        sender.close()
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
ours, theirs = Pipe()
payload = bytearray(1 << 20)
sender.send(ours, b"", [pickle.PickleBuffer(payload)])  # 1 MiB: through the arena

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def stand_in(tmp_path: Path, mode: str) -> Server:
    port = free_port()
    log = tmp_path / f"stand-in-{mode}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_STAND_IN), str(port), mode],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    return Server(url=f"http://127.0.0.1:{port}", model="stand-in", proc=proc, log=log)


def test_a_file_left_by_a_stopped_server_fails_the_stop_path(tmp_path: Path) -> None:
    with (
        pytest.raises(AssertionError, match="outlived their servers") as info,
        servers_started({"leaks": lambda: stand_in(tmp_path, "leaks")}) as started,
    ):
        pid = started["leaks"].proc.pid
    assert f"offload-{pid}-" in str(info.value)
    # Reported, then removed: nothing is left on the host.
    assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith(f"offload-{pid}-")]


def test_a_server_that_removes_its_files_passes(tmp_path: Path) -> None:
    with servers_started({"clean": lambda: stand_in(tmp_path, "cleans-up")}) as started:
        server = started["clean"]
        # The arena exists while the server runs: the check has something to miss.
        assert [p for p in Path("/dev/shm").iterdir() if p.name.startswith(f"offload-{server.proc.pid}-")]
    assert server.shm_left == ()
