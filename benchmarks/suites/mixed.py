"""Mixed traffic: how long a small request waits while heavy ones flood the server.

All rows' servers are started side by side (tiny models with random weights,
built here). Each round visits the rows in a fresh random order, and only the
row being measured gets traffic. With `--idle-servers paused` (the default)
every other server's process group is stopped (SIGSTOP) meanwhile, and a
server is resumed (SIGCONT, then `/health` answers) just before its row runs:
a server whose row is not measured still uses CPU (docs/benchmarks.md says
how much one smoke run saw), and up to six of them share the cores with the
one measured. `--idle-servers running` leaves them all running (every
result before this option existed). Either way the CPU that the servers not
being measured use during each measured phase is read from `/proc` and
reported (CPU seconds per second: ~0 when paused).

Small requests (`--small-arrivals`): `poisson` (the default) sends them
open-loop at `--small-rate` a second, exponential gaps drawn from `--seed`
(every row gets the same schedule in a round), each on a thread of its own
whatever the earlier ones' answers, at most `mixed.MAX_IN_FLIGHT` in flight
(one due beyond that is counted as unsent): every row is offered the same
load. They go out on plain sockets (`mixed.open_loop_timed`), which read
when each answer arrived by the kernel's clock as well as when the client
read it.
`closed` is `--small-clients` clients each sending its next request when the
last is answered (every result before this option existed): a row that
answers fast is sent more. Per row, two phases:

1. *alone*: small requests for `--seconds`;
2. *flooded*: 8 closed-loop clients send heavy requests from another process
   (`benchmarks/harness/mixed.py`); after a short ramp small requests are sent as
   alone for `--seconds` again, then the flood stops and its requests in
   flight are answered. `/health` is probed from a third process throughout.

Per row and round: small-request p50/p99 alone and flooded and their ratios
(flooded / alone), heavy requests completed per second while the small
requests ran, `/health` p99 during the flood, every request by its answer
(200, 503, other statuses, lost: sent and never answered, which must be 0),
small requests sent (and unsent) per phase, and the idle servers' CPU.
The report gives medians over rounds with distribution-free intervals
(`benchmarks/harness/stats.py`), per-round paired ratios between rows, and a
verdict per target (`targets` below), computed from the run.

    python -m benchmarks mixed                          # make bench-mixed: preprocess, 5 rounds
    python -m benchmarks mixed --variant engine --rounds 5
    python -m benchmarks mixed --rows "vLLM default" "thread fifo" --rounds 3
    python -m benchmarks mixed --small-arrivals closed --idle-servers running   # the method before
    python -m benchmarks mixed --smoke --out DIR
    python -m benchmarks mixed --health-port --rows "thread lanes" "process lanes"   # the health port too

`--health-port`: every row also serves the health endpoints
(`--offload-health-port`, answered by a process of their own, off the loop;
`vLLM default` through the adapter with no strategy, which keeps vLLM's own
behaviour and adds the port alone), and they are probed beside `/health`
throughout the flood, by a prober of their own; the report gives their p50
and p99, and a target per row (`HEALTH_PORT_P99_MS`).

Variants (`--variant`): `preprocess` (heavy = long inputs truncated to 32
tokens: the work is tokenization), `engine` (heavy = 16 inputs of 150 words,
untruncated: the engine shares the work), `score` (`/score` on a tiny
cross-encoder), `token-ids` (heavy = 16 lists of 512 token ids truncated to
32: vLLM's validation of the body is the loop's work), `multimodal` (image
embeddings on a tiny CLIP; skipped with a message where it cannot run). Rows (`--rows`) are the table `ROWS`; a row
whose `--offload-*` flags the installed adapter lacks is not run, except that
`--offload-scheduling fifo` is dropped where the adapter has no such flag (FIFO
is then its only behaviour). Writes mixed-<variant>.json and .md into --out
(default .benchmarks/runs/mixed/; `--health-port` runs into
mixed-<variant>-health-port.*, open-loop floods into
mixed-<variant>-heavy-<rate>-per-s.*); server logs under --out/logs/.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import common as _common
from benchmarks.harness import (
    idle_servers,
    load,
    mixed,
    models,
    procstat,
    progress,
    stats,
    thread_states,
)
from benchmarks.harness.server import (
    HOST,
    ServerConfig,
    ServerFailed,
    free_port,
    running_servers,
    switch_interval_env,
)

ROOT = Path(__file__).resolve().parents[2]

#: Starting the smoke run's two servers is most of it (as bench_paired's).
SMOKE_TIMEOUT_S = 900

# ---- rows ------------------------------------------------------------------

DEFAULT = "vLLM default"
TWO_WORKERS = ("--offload-workers", "2")  # as many as this machine has cores
SCHEDULING = "--offload-scheduling"
FIFO = (SCHEDULING, "fifo")
PRIORITY_POLICY = ("--scheduling-policy", "priority")  # vLLM's own flag
ENGINE_PRIORITY = "--offload-engine-priority"
#: Every server process's switch interval at 1 ms (CPython's is 5 ms).
SWITCH_1MS = switch_interval_env(0.001)
#: Flag and value that ask for what an adapter without the flag does anyway:
#: dropped where the adapter lacks the flag, so the row still runs.
TODAYS_BEHAVIOUR = {FIFO}


@dataclass(frozen=True)
class Row:
    """One row of the table: its server, and the rows it is compared with."""

    config: ServerConfig
    #: Adapter flags it cannot run without that its arguments do not name (fair
    #: scheduling is the default only where `--offload-scheduling` exists).
    needs: tuple[str, ...] = ()
    #: The same strategy under FIFO scheduling: the heavy-throughput target's baseline.
    fifo: str | None = None
    #: Further rows it is paired with (every row is paired with vLLM default).
    against: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.config.name


ROWS: dict[str, Row] = {row.name: row for row in (
    Row(ServerConfig(DEFAULT)),
    Row(ServerConfig("vLLM default + priority", extra_args=PRIORITY_POLICY)),
    Row(ServerConfig("thread fifo", "thread", (*TWO_WORKERS, *FIFO))),
    Row(ServerConfig("process fifo", "process", (*TWO_WORKERS, *FIFO))),
    Row(ServerConfig("thread lanes", "thread", TWO_WORKERS), needs=(SCHEDULING,), fifo="thread fifo"),
    Row(ServerConfig("process lanes", "process", TWO_WORKERS), needs=(SCHEDULING,), fifo="process fifo"),
    # Worker threads at the loop's priority (before the default became nice 10).
    Row(ServerConfig("thread lanes nice 0", "thread", (*TWO_WORKERS, "--offload-worker-nice", "0")),
        needs=(SCHEDULING,), fifo="thread fifo", against=("thread lanes",)),
    # Between the two: worker threads a little below the loop.
    Row(ServerConfig("thread lanes nice 5", "thread", (*TWO_WORKERS, "--offload-worker-nice", "5")),
        needs=(SCHEDULING,), fifo="thread fifo", against=("thread lanes", "thread lanes nice 0")),
    # Every call on a worker (before small calls ran on the loop by default).
    Row(ServerConfig("thread lanes inline 0", "thread", (*TWO_WORKERS, "--offload-inline-cost", "0")),
        needs=(SCHEDULING,), fifo="thread fifo", against=("thread lanes",)),
    Row(ServerConfig("process lanes inline 0", "process", (*TWO_WORKERS, "--offload-inline-cost", "0")),
        needs=(SCHEDULING,), fifo="process fifo", against=("process lanes",)),
    # A bound above a 96-pixel image's price (about 9,300): the multimodal variant's
    # small request rendered on the loop, its large images still on the workers.
    Row(ServerConfig("thread lanes inline 16384", "thread", (*TWO_WORKERS, "--offload-inline-cost", "16384")),
        needs=(SCHEDULING,), fifo="thread fifo", against=("thread lanes",)),
    Row(ServerConfig("process lanes inline 16384", "process", (*TWO_WORKERS, "--offload-inline-cost", "16384")),
        needs=(SCHEDULING,), fifo="process fifo", against=("process lanes",)),
    # One more worker for calls priced at most 16384 (one piece) and a quarter
    # of the costliest running, at the loop's priority: a small image no longer
    # waits for a worker busy with a large one. The default since these rows
    # were measured (results/express); "express 0" rows are the behaviour before.
    Row(ServerConfig("thread lanes express 16384", "thread", (*TWO_WORKERS, "--offload-express-cost", "16384")),
        needs=(SCHEDULING,), fifo="thread fifo", against=("thread lanes",)),
    Row(ServerConfig("process lanes express 16384", "process", (*TWO_WORKERS, "--offload-express-cost", "16384")),
        needs=(SCHEDULING,), fifo="process fifo", against=("process lanes",)),
    # Two pieces: what a one-image request needs since every image is priced
    # its fixed decoding cost too (docs/decisions/0015-a-fixed-price-per-image.md).
    Row(ServerConfig("process lanes express 32768", "process", (*TWO_WORKERS, "--offload-express-cost", "32768")),
        needs=(SCHEDULING,), fifo="process fifo", against=("process lanes",)),
    Row(ServerConfig("thread lanes express 0", "thread", (*TWO_WORKERS, "--offload-express-cost", "0")),
        needs=(SCHEDULING,), fifo="thread fifo", against=("thread lanes",)),
    Row(ServerConfig("process lanes express 0", "process", (*TWO_WORKERS, "--offload-express-cost", "0")),
        needs=(SCHEDULING,), fifo="process fifo", against=("process lanes",)),
    # The server's switch interval at 1 ms (CPython's is 5 ms), so that the loop
    # may wait less for a worker thread to drop the GIL (`harness/switch_interval`;
    # results/switch-1ms and switch-5ms: no difference beyond the noise).
    Row(ServerConfig("thread lanes switch 1ms", "thread", TWO_WORKERS, env=SWITCH_1MS),
        needs=(SCHEDULING,), fifo="thread fifo switch 1ms", against=("thread lanes",)),
    Row(ServerConfig("thread fifo switch 1ms", "thread", (*TWO_WORKERS, *FIFO), env=SWITCH_1MS)),
    # One worker thread: the loop contends for the GIL with one thread, not two
    # (image processing holds it for much of its time).
    Row(ServerConfig("thread lanes 1 worker", "thread", ("--offload-workers", "1")),
        needs=(SCHEDULING,), against=("thread lanes",)),
    # One worker thread at the loop's priority: vLLM's own image set-up (its
    # multimodal executor is one thread at the server's priority).
    Row(ServerConfig("thread lanes 1 worker nice 0", "thread", ("--offload-workers", "1", "--offload-worker-nice", "0")),
        needs=(SCHEDULING,), against=("thread lanes", "thread lanes 1 worker")),
    # vLLM's own validation of a `/v1/embeddings` body (the adapter's shortcut off):
    # what the shortcut buys apart from offloading, under the token-ids flood.
    Row(ServerConfig("thread lanes vLLM validation", "thread", (*TWO_WORKERS, "--offload-validation-shortcut", "0")),
        needs=(SCHEDULING,), fifo="thread fifo", against=("thread lanes",)),
    Row(ServerConfig("process lanes vLLM validation", "process", (*TWO_WORKERS, "--offload-validation-shortcut", "0")),
        needs=(SCHEDULING,), fifo="process fifo", against=("process lanes",)),
    Row(ServerConfig("process lanes + priority", "process", (*TWO_WORKERS, *PRIORITY_POLICY, ENGINE_PRIORITY)),
        needs=(SCHEDULING,), fifo="process fifo", against=("process lanes", "vLLM default + priority")),
    # A new user's servers: the strategy and nothing else, so as many workers as
    # the strategy picks (`thread`: min(32, cpus + 4) threads; `process`: one per CPU).
    Row(ServerConfig("thread defaults", "thread"), needs=(SCHEDULING,), against=("thread lanes",)),
    Row(ServerConfig("process defaults", "process"), needs=(SCHEDULING,),
        against=("process lanes", "thread defaults")),
)}
STANDARD_ROWS = (DEFAULT, "thread fifo", "process fifo", "thread lanes", "process lanes")
SMOKE_ROWS = (DEFAULT, "thread fifo")  # runs on every adapter, today's and later ones


def adapter_usage() -> str:
    """The adapter's usage line, which names every `--offload-*` flag it takes."""
    done = subprocess.run(
        [sys.executable, "-m", "offload_vllm", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    return done.stdout + done.stderr


def _has_flag(usage: str, flag: str) -> bool:
    return re.search(re.escape(flag) + r"(?![\w-])", usage) is not None


def plan(row: Row, usage: str) -> tuple[ServerConfig | None, list[str]]:
    """The row's server as the installed adapter can start it (None if it cannot), and notes."""
    args = list(row.config.extra_args)
    kept: list[str] = []
    notes: list[str] = []
    missing = [flag for flag in row.needs if not _has_flag(usage, flag)]
    i = 0
    while i < len(args):
        flag = args[i]
        value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
        width = 1 if value is None else 2
        if flag.startswith("--offload-") and not _has_flag(usage, flag):
            if (flag, value) in TODAYS_BEHAVIOUR:
                notes.append(f"run without `{flag} {value}`: the adapter has no such flag, and that is what it does")
            else:
                missing.append(flag)
        else:
            kept += args[i : i + width]
        i += width
    if missing:
        return None, [f"not run: needs {', '.join(dict.fromkeys(missing))}, which the installed adapter lacks"]
    return dataclasses.replace(row.config, extra_args=tuple(kept)), notes


# ---- variants --------------------------------------------------------------

SMALL_POOL = 64  # distinct small bodies: no two requests in a row are the same
HEAVY_POOL = 4  # distinct heavy bodies (each is large; the flood cycles through them)
HEAVY_SEED = 1000  # heavy texts differ from small ones
#: Share of RAM each server reserves for its KV cache: up to seven text servers
#: run at once; CLIP's profile run needs more (0.04 fails at start-up here).
TEXT_MEMORY = ("--gpu-memory-utilization", "0.04")
CLIP_MEMORY = ("--gpu-memory-utilization", "0.1")


@dataclass(frozen=True)
class Variant:
    description: str
    path: str
    build_model: Callable[[Path], Path]
    small: Callable[[str], mixed.Bodies]
    heavy: Callable[[str], mixed.Bodies]
    rows: tuple[str, ...] = STANDARD_ROWS
    server_args: tuple[str, ...] = TEXT_MEMORY


def _embed_model(root: Path) -> Path:
    return models.build_tiny_embedding_model(root / models.EMBED_NAME)


def _cross_encoder(root: Path) -> Path:
    return models.build_tiny_cross_encoder(root / models.CROSS_ENCODER_NAME)


def _clip(root: Path) -> Path:
    from benchmarks.harness.multimodal import CLIP_NAME, build_tiny_clip

    return build_tiny_clip(root / CLIP_NAME)


def _small_texts(model: str) -> mixed.Bodies:
    return mixed.bodies(mixed.text_bodies, model, count=SMALL_POOL, inputs=1, words=8)


VARIANTS: dict[str, Variant] = {
    "preprocess": Variant(
        "tiny BERT embeddings; small: one 8-word input; heavy: 16 inputs of 1500 words with "
        "`truncate_prompt_tokens: 32` (tokenization is the work, not the engine)",
        "/v1/embeddings", _embed_model, _small_texts,
        lambda m: mixed.bodies(mixed.text_bodies, m, count=HEAVY_POOL, inputs=16, words=1500, truncate=32,
                               seed=HEAVY_SEED),
    ),
    "engine": Variant(
        "tiny BERT embeddings; small: one 8-word input; heavy: 16 inputs of 150 words, untruncated "
        "(the engine shares the work)",
        "/v1/embeddings", _embed_model, _small_texts,
        lambda m: mixed.bodies(mixed.text_bodies, m, count=HEAVY_POOL, inputs=16, words=150, seed=HEAVY_SEED),
        rows=(DEFAULT, "vLLM default + priority", "thread fifo", "process fifo", "thread lanes", "process lanes",
              "process lanes + priority"),
    ),
    "token-ids": Variant(
        "tiny BERT embeddings; small: one 8-word input; heavy: 16 lists of 512 token ids with "
        "`truncate_prompt_tokens: 32` (vLLM's validation of the body is the loop's work)",
        "/v1/embeddings", _embed_model, _small_texts,
        lambda m: mixed.bodies(mixed.token_id_bodies, m, count=HEAVY_POOL, inputs=16, ids=512, truncate=32,
                               seed=HEAVY_SEED),
        rows=(DEFAULT, "thread lanes", "process lanes"),
    ),
    "score": Variant(
        "tiny BERT cross-encoder on `/score`; small: one 8-word query, 2 documents of 8 words; heavy: one "
        "query, 32 documents of 750 words (as many words as the preprocess variant's heavy request), "
        "`truncate_prompt_tokens: 32`",
        "/score", _cross_encoder,
        lambda m: mixed.bodies(mixed.score_bodies, m, count=SMALL_POOL, documents=2, words=8),
        lambda m: mixed.bodies(mixed.score_bodies, m, count=HEAVY_POOL, documents=32, words=750, truncate=32,
                               seed=HEAVY_SEED),
    ),
    "multimodal": Variant(
        "tiny CLIP image embeddings (base64 JPEGs); small: one 96-pixel image; heavy: 4 images of "
        "1024 pixels (photo-like JPEGs), one conversation each",
        "/v1/embeddings", _clip,
        lambda m: mixed.bodies(mixed.image_bodies, m, count=SMALL_POOL, images=1, size=96),
        lambda m: mixed.bodies(mixed.image_bodies, m, count=HEAVY_POOL, images=4, size=1024, seed=HEAVY_SEED),
        # The multimodal processor cache cannot be shared by several renderer
        # workers: the adapter refuses thread/process with it (docs/benchmarks.md).
        server_args=(*CLIP_MEMORY, "--mm-processor-cache-gb", "0"),
    ),
}

# ---- measurement -----------------------------------------------------------

# The mixed-traffic measurement: small requests against 8 heavy clients.
SMALL_ARRIVALS = ("poisson", "closed")
#: 10 small requests a second: about what the 2 closed-loop clients sent per
#: second under a FIFO flood (170 in 25 s, docs/benchmarks.md), so the flood
#: still dominates, and some 50 small requests per 5 s phase.
SMALL_RATE = 10.0
#: `--small-arrivals closed`: 2 clients, the method before open-loop arrivals.
SMALL_CLIENTS = 2
HEAVY_CLIENTS = 8
IDLE_SERVERS = idle_servers.MODES
#: 5 rounds: the fewest whose median interval ([min, max]) reaches 93.8% coverage.
ROUNDS = 5
#: 5 s phases: at the flooded p50 measured on main (0.5-1 s) each phase still
#: times about ten small requests, and a row's round takes about 15 s.
SECONDS = 5.0
#: The flood runs this long before the small requests start: every heavy client
#: has a request in the server within milliseconds, and a heavy request takes
#: about 0.1 s alone here, so a second is several of them in a row.
RAMP_S = 1.0
WARMUP_S = 1.0


@dataclass(frozen=True)
class SmallTraffic:
    """How the small requests of a phase are sent (`--small-arrivals`)."""

    arrivals: str = "poisson"
    #: Requests a second (`poisson`).
    rate: float = SMALL_RATE
    #: Closed-loop clients (`closed`).
    clients: int = SMALL_CLIENTS
    seed: int = 0
    max_in_flight: int = mixed.MAX_IN_FLIGHT

    def schedule(self, seconds: float, round_number: int, phase: str) -> list[float]:
        """Send times of a `poisson` phase: one schedule per round and phase, the
        same for every row, so that rows are offered the same requests."""
        rng = random.Random(f"small {self.seed} {round_number} {phase}")
        return mixed.poisson_arrivals(self.rate, seconds, rng)

    def run(self, url: str, bodies: list[bytes], seconds: float, round_number: int, phase: str) -> mixed.Tally:
        if self.arrivals == "closed":
            return mixed.run_for(url, bodies, self.clients, seconds)
        return mixed.run_open_timed(url, bodies, self.schedule(seconds, round_number, phase), self.max_in_flight)

    def describe(self) -> str:
        if self.arrivals == "closed":
            return f"{self.clients} closed-loop clients"
        return (f"open-loop, Poisson arrivals at {self.rate:g}/s (seed {self.seed}, the same schedule for every "
                f"row in a round; at most {self.max_in_flight} in flight)")


@dataclass(frozen=True)
class HeavyTraffic:
    """How the flood's heavy requests are sent (`--heavy-clients`, `--heavy-rate`)."""

    #: Closed-loop clients (`rate` 0).
    clients: int = HEAVY_CLIENTS
    #: Requests a second, open-loop with Poisson arrivals; 0: closed-loop clients.
    rate: float = 0.0
    seed: int = 0

    def schedule(self, seconds: float, round_number: int) -> list[float] | None:
        """Send times of one flood (`None`: closed loop), the same for every row in a round."""
        if not self.rate:
            return None
        return mixed.poisson_arrivals(self.rate, seconds, random.Random(f"heavy {self.seed} {round_number}"))

    def describe(self) -> str:
        if not self.rate:
            return f"{self.clients} closed-loop heavy clients"
        return (f"heavy requests open-loop, Poisson arrivals at {self.rate:g}/s (seed {self.seed}, the same "
                f"schedule for every row in a round)")


def measure(
    url: str, small: list[bytes], heavy: mixed.Bodies, traffic: SmallTraffic, heavy_traffic: HeavyTraffic,
    seconds: float, ramp_s: float, round_number: int = 0, idle_cpu: Callable[[], float] = lambda: 0.0,
    loop_pid: int | None = None, health_port_url: str | None = None,
) -> dict[str, Any]:
    """One row's two phases: small requests alone, then under the flood; `idle_cpu()`
    reads the CPU used so far by the servers not being measured; with
    `health_port_url`, the health port's `/health` is probed too; with `loop_pid`,
    what that process's main thread (the API server's event loop) spends the
    flooded phase on (`thread_states`), and the CPU its server's parts use then
    (`procstat`)."""
    cpu_before, start = idle_cpu(), time.monotonic()
    alone = traffic.run(url, small, seconds, round_number, "alone")
    alone_window = (start, time.monotonic())
    idle = {"alone": _per_s(idle_cpu() - cpu_before, alone_window)}
    # Long enough for the flooded phase, which waits for its last small answers.
    arrivals = heavy_traffic.schedule(ramp_s + seconds + load.REQUEST_TIMEOUT_S, round_number)
    with ExitStack() as probing:
        prober = probing.enter_context(load.HealthProber(_base(url)))
        port_prober = (
            probing.enter_context(load.HealthProber(health_port_url)) if health_port_url is not None else None
        )
        flood = probing.enter_context(mixed.Flood(url, heavy, heavy_traffic.clients, arrivals))
        # Where each ran (`load.autogroup`): the probers' groups apart from the clients'.
        groups = {
            "health": load.autogroup(prober.pid or 0), "flood": load.autogroup(flood.pid or 0),
            "small": load.autogroup(),
            **({"health_port": load.autogroup(port_prober.pid or 0)} if port_prober is not None else {}),
        }
        time.sleep(ramp_s)
        with ExitStack() as sampling:
            loop = sampling.enter_context(thread_states.ThreadStates(loop_pid)) if loop_pid is not None else None
            parts_before = procstat.snapshot(loop_pid) if loop_pid is not None else None
            cpu_before, begin = idle_cpu(), time.monotonic()
            flooded = traffic.run(url, small, seconds, round_number, "flooded")
            window = (begin, time.monotonic())
            idle["flooded"] = _per_s(idle_cpu() - cpu_before, window)
            parts = None
            if parts_before is not None and loop_pid is not None:
                parts = procstat.cpu_used(parts_before, procstat.snapshot(loop_pid))
    block = {
        "alone": alone.summary(alone_window),
        "flooded": flooded.summary(window),
        "heavy": flood.tally.summary(window),
        "health": prober.summary(),
        "idle_cpu_per_s": idle,
        "scheduling_groups": groups,
    }
    if port_prober is not None:
        block["health_port"] = port_prober.summary()
    if loop is not None:
        block["loop"] = loop.summary()
    if parts is not None:
        block["server_cpu_per_s"] = {part: _per_s(parts[part], window) for part in SERVER_PARTS}
    return block


def serving_health_port(config: ServerConfig, port: int | str) -> ServerConfig:
    """`config` serving the health port too (`--offload-health-port`); a row
    with no strategy through the adapter's launcher (`ServerConfig.plugin`):
    vLLM's own behaviour, the port beside it."""
    return dataclasses.replace(config, plugin=True, extra_args=(*config.extra_args, "--offload-health-port", str(port)))


def _health_port_url(port: int | None) -> str | None:
    return None if port is None else f"http://{HOST}:{port}"


def _per_s(amount: float, window: tuple[float, float]) -> float:
    begin, end = window
    return amount / (end - begin) if end > begin else 0.0


def _base(url: str) -> str:
    """`http://host:port` of an endpoint's URL."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def _ratio(top: float, bottom: float) -> float | None:
    return top / bottom if bottom > 0 else None


#: metric -> (what the report calls it, how to read it from a block; None: not measured).
METRICS: dict[str, tuple[str, Callable[[dict[str, Any]], float | None]]] = {
    "alone_p50_ms": ("small p50 alone (ms)", lambda b: b["alone"]["p50_ms"] or None),
    "flooded_p50_ms": ("small p50 flooded (ms)", lambda b: b["flooded"]["p50_ms"] or None),
    "p50_ratio": ("p50 flooded / alone", lambda b: _ratio(b["flooded"]["p50_ms"], b["alone"]["p50_ms"])),
    "alone_p99_ms": ("small p99 alone (ms)", lambda b: b["alone"]["p99_ms"] or None),
    "flooded_p99_ms": ("small p99 flooded (ms)", lambda b: b["flooded"]["p99_ms"] or None),
    "p99_ratio": ("p99 flooded / alone", lambda b: _ratio(b["flooded"]["p99_ms"], b["alone"]["p99_ms"])),
    "heavy_per_s": ("heavy requests/s flooded", lambda b: b["heavy"]["requests_per_s"]),
    "health_p99_ms": ("/health p99 flooded (ms)", lambda b: b["health"]["p99_ms"]),
    # The health port's (`--health-port`).
    "health_port_p50_ms": ("health port p50 flooded (ms)", lambda b: b.get("health_port", {}).get("p50_ms")),
    "health_port_p99_ms": ("health port p99 flooded (ms)", lambda b: b.get("health_port", {}).get("p99_ms")),
    # What the clients' own scheduling added, taken out (this machine runs them
    # beside the server): small requests and /health until the answer arrived
    # (the kernel's receive stamp, `raw_http`); small requests less the
    # client's wait for a CPU (a lower bound, `load.less_wait_ms`).
    "p50_ratio_arrived": ("p50 flooded / alone, until the answer arrived",
                          lambda b: _phase_ratio(b, "p50_arrived_ms")),
    "p99_ratio_arrived": ("p99 flooded / alone, until the answer arrived",
                          lambda b: _phase_ratio(b, "p99_arrived_ms")),
    "p50_ratio_less_wait": ("p50 flooded / alone, less the client's CPU wait (lower bound)",
                            lambda b: _phase_ratio(b, "p50_less_wait_ms")),
    "p99_ratio_less_wait": ("p99 flooded / alone, less the client's CPU wait (lower bound)",
                            lambda b: _phase_ratio(b, "p99_less_wait_ms")),
    "health_p99_arrived_ms": ("/health p99 flooded, until the answer arrived (ms)",
                              lambda b: b["health"].get("p99_arrived_ms")),
    "health_port_p99_arrived_ms": ("health port p99 flooded, until the answer arrived (ms)",
                                   lambda b: b.get("health_port", {}).get("p99_arrived_ms")),
}
#: The metrics without the clients' own scheduling: a table of their own.
WITHOUT_CLIENT_WAIT = (
    "p50_ratio_arrived", "p99_ratio_arrived", "p50_ratio_less_wait", "p99_ratio_less_wait", "health_p99_arrived_ms",
    "health_port_p99_arrived_ms",
)
#: Lower bounds, reported and never judged against a target.
LOWER_BOUNDS = ("p50_ratio_less_wait", "p99_ratio_less_wait")


def _phase_ratio(block: dict[str, Any], key: str) -> float | None:
    """The small requests' `key` flooded over alone; None where either phase lacks it."""
    flooded, alone = block["flooded"].get(key), block["alone"].get(key)
    return None if flooded is None or alone is None else _ratio(flooded, alone)
#: The phases small requests are sent in.
PHASES = ("alone", "flooded")
#: What the API server's loop thread spent the flooded phase on (`thread_states`), as reported.
LOOP_KEYS = (*thread_states.STATES, "cpu_s_per_s", "runqueue_s_per_s")
LOOP_LABELS = (
    "running (on a CPU or runnable)", "waiting for a lock (futex: mostly the GIL)", "idle in its selector", "other",
    "CPU s/s", "run-queue wait s/s",
)
#: The measured server's parts whose CPU the flooded phase reports (`procstat.cpu_used`).
SERVER_PARTS = ("api", "workers", "engine")
SERVER_PART_LABELS = (
    "API server process (loop and worker threads)", "offload's worker processes",
    "vLLM's engine processes (engine core, model worker)",
)
#: Metrics compared between rows, round by round.
PAIRED = ("flooded_p50_ms", "flooded_p99_ms", "heavy_per_s", "health_p99_ms", "health_p99_arrived_ms")


def _values(blocks: list[dict[str, Any]], metric: str) -> list[float | None]:
    return [METRICS[metric][1](b) for b in blocks]


def _interval(values: list[float | None]) -> dict[str, float] | None:
    present = [v for v in values if v is not None]
    return stats.median_interval(present).__dict__ if present else None


def pairs(rows: list[str]) -> list[tuple[str, str]]:
    """(row, baseline) pairs among the rows run: each row against vLLM default, its
    FIFO twin and the rows it names."""
    out: list[tuple[str, str]] = []
    for name in rows:
        row = ROWS[name]
        for base in (DEFAULT, row.fifo, *row.against):
            if base is not None and base != name and base in rows and (name, base) not in out:
                out.append((name, base))
    return out


def paired_ratios(blocks: dict[str, list[dict[str, Any]]], row: str, base: str, metric: str) -> list[float]:
    """Per-round ratios row / base (rounds where either was not measured are left out)."""
    return [
        top / bottom
        for top, bottom in zip(_values(blocks[row], metric), _values(blocks[base], metric), strict=True)
        if top is not None and bottom
    ]


def summarize(blocks: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rows = list(blocks)
    summary: dict[str, Any] = {"rows": {}, "pairs": []}
    for row, row_blocks in blocks.items():
        counts = {}
        for kind in ("alone", "flooded", "heavy"):
            statuses: dict[str, int] = {}
            for b in row_blocks:
                for status, n in b[kind]["statuses"].items():
                    statuses[status] = statuses.get(status, 0) + n
            counts[kind] = {
                "sent": sum(b[kind]["sent"] for b in row_blocks),
                "statuses": statuses,
                "lost": sum(b[kind]["lost"] for b in row_blocks),
                # Due by an open-loop schedule, not sent: the in-flight bound was reached.
                "unsent": sum(b[kind].get("unsent", 0) for b in row_blocks),
            }
        idle = [b["idle_cpu_per_s"] for b in row_blocks if "idle_cpu_per_s" in b]
        loops = [b["loop"] for b in row_blocks if "error" not in b.get("loop", {"error": ""})]
        parts = [b["server_cpu_per_s"] for b in row_blocks if "server_cpu_per_s" in b]
        summary["rows"][row] = {
            "values": {m: _interval(_values(row_blocks, m)) for m in METRICS},
            "counts": counts,
            # Per round, so that rows' offered loads can be compared.
            "small_sent": {phase: [b[phase]["sent"] for b in row_blocks] for phase in PHASES},
            "small_unsent": {phase: [b[phase].get("unsent", 0) for b in row_blocks] for phase in PHASES},
            "idle_cpu_per_s": {phase: _interval([i[phase] for i in idle]) for phase in PHASES} if idle else None,
            "health_failures": sum(int(b["health"].get("failures", 0)) for b in row_blocks),
            "loop": {key: _interval([loop[key] for loop in loops]) for key in LOOP_KEYS} if loops else None,
            "server_cpu_per_s": {part: _interval([p[part] for p in parts]) for part in SERVER_PARTS} if parts else None,
        }
    for row, base in pairs(rows):
        ratios = {}
        for metric in PAIRED:
            values = paired_ratios(blocks, row, base, metric)
            ratios[metric] = stats.median_interval(values).__dict__ if values else None
        summary["pairs"].append({"row": row, "baseline": base, "ratios": ratios})
    return summary


# ---- targets ---------------------------------------------------------------

#: The mixed-traffic targets' bounds.
SMALL_P50_BOUND = 3.0  # small p50 flooded <= 3x alone
SMALL_P99_BOUND = 5.0  # small p99 flooded <= 5x alone
HEAVY_VS_FIFO_BOUND = 0.95  # heavy throughput >= 0.95x the same strategy under FIFO
HEAVY_VS_DEFAULT_BOUND = 0.9  # ... and >= 0.9x vLLM default's
HEALTH_P99_FLOOR_MS = 10.0  # /health p99 flooded <= max(10 ms, vLLM default's)
HEALTH_PORT_P99_MS = 5.0  # the health port's /health p99 flooded <= 5 ms (`--health-port`)
PRIORITY_P99_BOUND = 0.3  # with engine priority: small p99 flooded <= 0.3x vLLM default's


@dataclass(frozen=True)
class Target:
    row: str
    what: str
    metric: str
    bound: float
    at_least: bool = False
    #: None: the row's own per-round values (a ratio already); else paired with this row.
    baseline: str | None = None
    #: The bound is raised to this row's median of the same metric (an absolute
    #: target that the baseline server may itself miss, such as /health's).
    raised_to_median_of: str | None = None
    #: What the values and the bound are in: "x" (a ratio) or "ms".
    unit: str = "x"


def targets(rows: list[str], health_port: bool = False) -> list[Target]:
    """The mixed-traffic targets that the rows run can be checked against
    (`health_port`: the rows' health ports were probed)."""
    out: list[Target] = []
    for name in rows:
        row = ROWS[name]
        out += [
            Target(name, "small p50 flooded / alone", "p50_ratio", SMALL_P50_BOUND),
            Target(name, "small p99 flooded / alone", "p99_ratio", SMALL_P99_BOUND),
            # The same, without the client's wait to read the answer (judged where measured).
            Target(name, "small p50 flooded / alone, until the answer arrived", "p50_ratio_arrived",
                   SMALL_P50_BOUND),
            Target(name, "small p99 flooded / alone, until the answer arrived", "p99_ratio_arrived",
                   SMALL_P99_BOUND),
        ]
        if row.fifo in rows:
            out.append(Target(name, f"heavy requests/s vs `{row.fifo}`", "heavy_per_s", HEAVY_VS_FIFO_BOUND,
                              at_least=True, baseline=row.fifo))
        if row.config.strategy is not None and DEFAULT in rows:
            out.append(Target(name, f"heavy requests/s vs `{DEFAULT}`", "heavy_per_s", HEAVY_VS_DEFAULT_BOUND,
                              at_least=True, baseline=DEFAULT))
            out.append(Target(name, f"/health p99 flooded, until the answer arrived, vs max({HEALTH_P99_FLOOR_MS:g} ms, "
                              f"`{DEFAULT}`'s)", "health_p99_arrived_ms", HEALTH_P99_FLOOR_MS,
                              raised_to_median_of=DEFAULT, unit="ms"))
        if health_port:
            out.append(Target(name, "health port p99 flooded", "health_port_p99_ms", HEALTH_PORT_P99_MS, unit="ms"))
            out.append(Target(name, "health port p99 flooded, until the answer arrived", "health_port_p99_arrived_ms",
                              HEALTH_PORT_P99_MS, unit="ms"))
        if "--scheduling-policy" in row.config.extra_args and name != DEFAULT and DEFAULT in rows:
            out.append(Target(name, f"small p99 flooded vs `{DEFAULT}`", "flooded_p99_ms", PRIORITY_P99_BOUND,
                              baseline=DEFAULT))
    return out


def evaluate(target: Target, blocks: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    if target.baseline is None:
        values = [v for v in _values(blocks[target.row], target.metric) if v is not None]
    else:
        values = paired_ratios(blocks, target.row, target.baseline, target.metric)
    result: dict[str, Any] = {**dataclasses.asdict(target), "interval": None, "met": None, "whole_interval": None}
    bound = target.bound
    if target.raised_to_median_of is not None:
        theirs = [v for v in _values(blocks[target.raised_to_median_of], target.metric) if v is not None]
        if not theirs:
            return result
        bound = result["bound"] = max(bound, stats.median_interval(theirs).median)
    if not values:
        return result
    interval = stats.median_interval(values)

    def within(x: float) -> bool:
        return x >= bound if target.at_least else x <= bound

    result.update(
        interval=interval.__dict__, met=within(interval.median),
        # Whether the interval lies on the same side of the bound as the median.
        whole_interval=within(interval.low) == within(interval.high) == within(interval.median),
    )
    return result


def verdict_line(result: dict[str, Any]) -> str:
    sign = ">=" if result["at_least"] else "<="
    unit = result["unit"]
    space = " " if unit == "ms" else ""
    head = f"- `{result['row']}`: {result['what']} {sign} {result['bound']:.3g}{space}{unit}:"
    interval = result["interval"]
    if interval is None:
        return f"{head} not measured"
    word = "met" if result["met"] else "missed"
    where = "the whole interval" if result["whole_interval"] else "the interval crosses the bound"
    return f"{head} {_fmt(interval, 1 if unit == 'ms' else 2)}{space}{unit} — **{word}** (median; {where})"


# ---- report ----------------------------------------------------------------


def _intervals_table(
    caption: str, labels: tuple[str, ...], keys: tuple[str, ...], per_row: dict[str, dict[str, Any] | None],
) -> list[str]:
    """A table of intervals by row and key after `caption`; none if no row has them
    (a row without them shows dashes)."""
    if not any(per_row.values()):
        return []
    lines = ["", caption, "", "| row | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for row, values in per_row.items():
        cells = [_fmt(values[key]) if values else "–" for key in keys]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def _fmt(interval: dict[str, float] | None, digits: int = 2) -> str:
    if interval is None:
        return "–"
    return f"{interval['median']:.{digits}f} [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"


def _statuses(counts: dict[str, Any]) -> str:
    statuses = counts["statuses"]
    other = sum(n for s, n in statuses.items() if s not in ("200", "503"))
    return f"{counts['sent']} / {statuses.get('200', 0)} / {statuses.get('503', 0)} / {other} / {counts['lost']}"


def _heavy_traffic(result: dict[str, Any]) -> str:
    """The flood a result was measured with (results before open-loop floods: closed loop)."""
    return HeavyTraffic(**(result.get("heavy") or {"clients": result["heavy_clients"]})).describe()


def _small_traffic(result: dict[str, Any]) -> str:
    """The small traffic a result was measured with (results before open-loop arrivals: closed loop)."""
    small = result.get("small") or {"arrivals": "closed", "clients": result["small_clients"]}
    return SmallTraffic(**small).describe()


def _idle_servers(result: dict[str, Any]) -> str:
    if result.get("idle_servers", "running") == "running":
        return "every row's server running throughout, idle ones included"
    return "every server stopped (SIGSTOP) while another row was measured, resumed before its own"


def _probers_line(result: dict[str, Any]) -> str:
    """Where the `/health` probers ran: each in a session of its own (results
    since it was so), in a scheduling group apart from the clients' in every block."""
    blocks = [b for row_blocks in result["blocks"].values() for b in row_blocks]
    if not all("scheduling_groups" in b for b in blocks):
        return ("The `/health` probers ran in the benchmark's session, in its scheduling group with the clients "
                "(results from before each prober had a session of its own).")
    clients = ("flood", "small")
    apart = all(
        group is not None and group not in {b["scheduling_groups"][c] for c in clients}
        for b in blocks for name, group in b["scheduling_groups"].items() if name not in clients
    )
    enabled = {"1": "on", "0": "off"}.get(str(result.get("autogroups_enabled")), "not known")
    return (f"The `/health` probers each ran in a session of their own, as a kubelet probes from a process of its "
            f"own, not in the load generator's: in a scheduling group (Linux autogroup, scheduling by them "
            f"{enabled} here) apart from the flood's and the small requests' clients' "
            f"{'in every block' if apart else 'NOT in every block'} (`/proc/PID/autogroup`).")


def _idle_cpu_values(result: dict[str, Any]) -> list[float]:
    return [b["idle_cpu_per_s"][phase] for blocks in result["blocks"].values() for b in blocks
            if "idle_cpu_per_s" in b for phase in PHASES]


def _idle_line(result: dict[str, Any]) -> str:
    values = sorted(_idle_cpu_values(result))
    if not values:
        return "CPU of the servers not being measured: not recorded (results from before it was)."
    return (f"CPU of the servers not being measured (idle servers {result.get('idle_servers', 'running')}; "
            f"every process of their groups, from /proc) during the measured phases: "
            f"{stats.median_interval(values).median:.3f} CPU-s/s at the median over {len(values)} phases, "
            f"{values[-1]:.3f} at most.")


def _server_command(config: ServerConfig, server_args: tuple[str, ...]) -> str:
    argv = dataclasses.replace(config, extra_args=(*server_args, *config.extra_args)).command(Path("MODEL"), 8000)
    env = []
    for name, value in sorted(config.env.items()):
        if name == "PYTHONPATH":  # the row's own folder, first: the rest is the caller's
            value = os.path.relpath(value.split(os.pathsep)[0], ROOT)
        env.append(f"{name}={value}")
    return " ".join([*env, "python", *argv[1:]])


def markdown(result: dict[str, Any]) -> str:
    if result.get("skipped"):
        return f"# Mixed traffic, `{result['variant']}`\n\nNot run: {result['skipped']}\n"
    summary = result["summary"]
    rows = list(summary["rows"])
    coverage = stats.median_interval([0.0] * result["rounds"]).coverage
    lines = [
        f"# Mixed traffic, `{result['variant']}`",
        "",
        "<!-- --8<-- [start:meta] -->",
        _common.run_line(result),
        "",
        (f"{VARIANTS[result['variant']].description}. Small requests: {_small_traffic(result)}, alone and then with "
         f"{_heavy_traffic(result)} (after a {result['ramp_s']:g} s ramp); {result['rounds']} "
         f"round{'s' if result['rounds'] != 1 else ''} of {result['seconds']:g} s phases, rows in a fresh random order each round; "
         f"{_idle_servers(result)}. Medians over rounds, "
         f"[intervals] from order statistics (coverage {100 * coverage:.1f}% with {result['rounds']} rounds). "
         f"Run took {result['wall_s']:.0f} s, of which server start-up {result['startup_s']:.0f} s."),
        "<!-- --8<-- [end:meta] -->",
        "",
        "<!-- --8<-- [start:tables] -->",
        "| row | " + " | ".join(label for m, (label, _) in METRICS.items() if m not in WITHOUT_CLIENT_WAIT) + " |",
        "|---|" + "---|" * (len(METRICS) - len(WITHOUT_CLIENT_WAIT)),
    ]

    def cells(row: str, metrics: Iterable[str]) -> str:
        values = summary["rows"][row]["values"]
        return " | ".join(_fmt(values.get(m), 1 if m.endswith("_ms") or m == "heavy_per_s" else 2) for m in metrics)

    lines += [f"| {row} | {cells(row, (m for m in METRICS if m not in WITHOUT_CLIENT_WAIT))} |" for row in rows]
    if any(summary["rows"][row]["values"].get(m) for row in rows for m in WITHOUT_CLIENT_WAIT):
        lines += [
            "",
            ("Without the clients' own scheduling: the clients share the server's 2 cores, so a latency "
             "includes the time the client, once answered, waited for a CPU to read the answer. The `/health` "
             "prober and the open-loop small requests' client (plain sockets) read when each answer reached "
             "their socket (the kernel's receive timestamp, `SO_TIMESTAMPNS`): the server's time and the "
             "network's. The small requests' client also reads its own run-queue time "
             "(`/proc/thread-self/schedstat`) before and after each request; the latency less that is a lower "
             "bound of the server's time, since a client preempted just after sending also waits while the "
             "server works (never judged):"),
            "",
            "| row | " + " | ".join(METRICS[m][0] for m in WITHOUT_CLIENT_WAIT) + " |",
            "|---|" + "---|" * len(WITHOUT_CLIENT_WAIT),
        ]
        lines += [f"| {row} | {cells(row, WITHOUT_CLIENT_WAIT)} |" for row in rows]
    lines += [
        "",
        ("Requests, all rounds (sent / 200 / 503 / other status / lost: sent, never answered), and the small "
         "requests sent in each round (alone; flooded):"),
        "",
        "| row | small alone | small flooded | heavy | /health probes failed | small sent per round |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        counts = summary["rows"][row]["counts"]
        per_round = summary["rows"][row].get("small_sent") or {
            phase: [b[phase]["sent"] for b in result["blocks"][row]] for phase in PHASES
        }
        lines.append(
            f"| {row} | {_statuses(counts['alone'])} | {_statuses(counts['flooded'])} | "
            f"{_statuses(counts['heavy'])} | {summary['rows'][row]['health_failures']} | "
            f"{' '.join(map(str, per_round['alone']))}; {' '.join(map(str, per_round['flooded']))} |"
        )
    unsent = {row: sum(summary["rows"][row]["counts"][phase].get("unsent", 0) for phase in PHASES) for row in rows}
    if any(unsent.values()):
        lines += ["", "Small requests due and not sent (the in-flight bound was reached): "
                  + ", ".join(f"{row} {n}" for row, n in unsent.items())]
    lines += ["", _probers_line(result), "", _idle_line(result)]
    if result.get("memory_mib"):
        lines += [
            "",
            ("Memory after the warm-up, PSS in MiB (`procstat.memory_mib`; pages shared between processes "
             "split among them): API server process, offload's worker processes (together; how many), "
             "the rest (vLLM's engine):"),
            "",
            "| row | API server | worker processes | per worker process | engine |",
            "|---|---|---|---|---|",
        ]
        for row, used in result["memory_mib"].items():
            if used:
                each = used["workers"] / used["worker_processes"] if used["worker_processes"] else 0.0
                lines.append(f"| {row} | {used['api']:.0f} | {used['workers']:.0f} ({used['worker_processes']:.0f}) "
                             f"| {each:.0f} | {used['engine']:.0f} |")
    lines += _intervals_table(
        ("The API server's event-loop thread (the server's main thread) during the flooded phase: shares of "
         f"samples every {thread_states.INTERVAL_S * 1000:g} ms of its state and wait channel, and CPU and "
         "run-queue seconds per second from its schedstat (`benchmarks/harness/thread_states.py`):"),
        LOOP_LABELS, LOOP_KEYS, {row: summary["rows"][row].get("loop") for row in rows},
    )
    lines += _intervals_table(
        ("CPU of the measured server's processes during the flooded phase, CPU-s/s, from `/proc` "
         "(`benchmarks/harness/procstat.py`; on this CPU-only host vLLM's model worker runs the model):"),
        SERVER_PART_LABELS, SERVER_PARTS, {row: summary["rows"][row].get("server_cpu_per_s") for row in rows},
    )
    if summary["pairs"]:
        lines += [
            "",
            "Paired ratios, row / baseline per round (median [interval]):",
            "",
            "| row | baseline | " + " | ".join(METRICS[m][0] for m in PAIRED) + " |",
            "|---|---|" + "---|" * len(PAIRED),
        ]
        for pair in summary["pairs"]:
            ratio_cells = [f"{_fmt(pair['ratios'][m])}x" if pair["ratios"][m] else "–" for m in PAIRED]
            lines.append(f"| {pair['row']} | {pair['baseline']} | " + " | ".join(ratio_cells) + " |")
    errors = {
        row: {kind: b[kind]["first_error"] for b in result["blocks"][row] for kind in ("alone", "flooded", "heavy")
              if b[kind]["first_error"]}
        for row in rows
    }
    errors = {row: e for row, e in errors.items() if e}
    lines += ["", "Servers (model path and port vary):", ""]
    lines += [f"- {row}: `{result['servers'][row]['command']}`" for row in rows]
    for row, notes in result["notes"].items():
        lines += [f"- {row}: {note}" for note in notes]
    if errors:
        lines += ["", f"First error of each kind: {json.dumps(errors)}"]
    lines += [
        "<!-- --8<-- [end:tables] -->",
        "",
        "<!-- --8<-- [start:targets] -->",
        *(verdict_line(t) for t in result["targets"]),
        "<!-- --8<-- [end:targets] -->",
    ]
    return "\n".join(lines) + "\n"


# ---- main ------------------------------------------------------------------


def _write(out: Path, result: dict[str, Any]) -> None:
    _common.write(out, result_name(result), result, markdown(result))


def result_name(result: dict[str, Any]) -> str:
    """The stem of a run's result files: `mixed-<variant>`, and what sets the
    run apart from the standard one. An open-loop flood and the health port
    are other experiments: their results do not replace the standard run's."""
    heavy = result.get("heavy") or {}
    return (f"mixed-{result['variant']}" + (f"-heavy-{heavy['rate']:g}-per-s" if heavy.get("rate") else "")
            + ("-health-port" if result.get("health_port") else ""))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true",
                   help=f"rows {' and '.join(SMOKE_ROWS)}, one round of 1.5 s phases")
    p.add_argument("--variant", choices=sorted(VARIANTS), default="preprocess")
    p.add_argument("--rows", nargs="+", choices=list(ROWS), help="default: the variant's rows")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--seconds", type=float, default=SECONDS, help="length of each phase")
    p.add_argument("--small-arrivals", choices=SMALL_ARRIVALS, default=SMALL_ARRIVALS[0],
                   help="poisson: open loop at --small-rate; closed: --small-clients clients, each waiting for its answer")
    p.add_argument("--small-rate", type=float, default=SMALL_RATE, help="small requests a second (poisson)")
    p.add_argument("--small-clients", type=int, default=SMALL_CLIENTS, help="closed-loop small clients (closed)")
    p.add_argument("--heavy-clients", type=int, default=HEAVY_CLIENTS, help="closed-loop heavy clients")
    p.add_argument("--heavy-rate", type=float, default=0.0,
                   help="heavy requests a second, open-loop (Poisson), the same for every row: compares the rows "
                        "at equal heavy load; 0 (default): --heavy-clients closed-loop clients")
    p.add_argument("--idle-servers", choices=IDLE_SERVERS, default=IDLE_SERVERS[0],
                   help="paused: stop every server but the measured row's (SIGSTOP); running: leave them running")
    p.add_argument("--seed", type=int, default=0, help="the rows' order and the small requests' arrivals")
    p.add_argument("--health-port", action="store_true",
                   help="every row serves the health port too (--offload-health-port; vLLM default through the "
                        "adapter with no strategy), probed beside /health")
    p.add_argument("--out", type=Path, default=_common.RESULTS / "mixed")
    args = p.parse_args(argv)
    if args.small_rate <= 0:
        p.error("--small-rate must be above 0")
    if args.heavy_rate < 0:
        p.error("--heavy-rate must be 0 (closed loop) or above")
    heavy_traffic = HeavyTraffic(args.heavy_clients, args.heavy_rate, args.seed)
    variant = VARIANTS[args.variant]
    traffic = SmallTraffic(args.small_arrivals, args.small_rate, args.small_clients, args.seed)
    if args.smoke:  # proves the whole run works in a few minutes; measures nothing
        wanted, rounds, seconds, ramp_s, warmup_s = list(SMOKE_ROWS), 1, 1.5, 0.5, 0.5
    else:
        wanted, rounds, seconds, ramp_s, warmup_s = args.rows or list(variant.rows), args.rounds, args.seconds, \
            RAMP_S, WARMUP_S
    if DEFAULT not in wanted:
        wanted = [DEFAULT, *wanted]
    began = time.monotonic()
    result: dict[str, Any] = {
        "argv": argv, "command": " ".join(["python -m benchmarks mixed", *map(_quote, argv)]),
        "variant": args.variant, "machine": _common.machine(), "dirty": _common.dirty(), "loadavg_before": _common.loadavg(),
        "rounds": rounds, "seconds": seconds, "ramp_s": ramp_s,
        "small_clients": args.small_clients, "heavy_clients": args.heavy_clients,
        "small": dataclasses.asdict(traffic), "heavy": dataclasses.asdict(heavy_traffic),
        "idle_servers": args.idle_servers, "health_port": args.health_port,
        "autogroups_enabled": _common.autogroups_enabled(),
    }

    usage = adapter_usage()
    configs: dict[str, ServerConfig] = {}
    notes: dict[str, list[str]] = {}
    for name in wanted:
        config, row_notes = plan(ROWS[name], usage)
        notes[name] = row_notes
        for note in row_notes:
            print(f"{name}: {note}", flush=True)
        if config is not None:
            configs[name] = config
    rows = list(configs)
    result["notes"] = {name: n for name, n in notes.items() if n}
    result["servers"] = {
        name: {"command": _server_command(serving_health_port(config, "PORT") if args.health_port else config,
                                          variant.server_args)}
        for name, config in configs.items()
    }

    shuffle = random.Random(args.seed)
    blocks: dict[str, list[dict[str, Any]]] = {row: [] for row in rows}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        try:
            model = variant.build_model(Path(tmp))
        except (ImportError, OSError, ValueError) as exc:
            if args.variant != "multimodal":
                raise
            return _skip(args.out, result, f"the tiny CLIP could not be built here ({type(exc).__name__}: {exc})")
        small = variant.small(str(model))()
        heavy = variant.heavy(str(model))
        started = time.monotonic()
        health_ports = {row: free_port() for row in rows} if args.health_port else {}
        with_variant = {
            row: dataclasses.replace(config, extra_args=(*variant.server_args, *config.extra_args))
            for row in rows
            for config in [serving_health_port(configs[row], health_ports[row]) if row in health_ports else configs[row]]
        }
        logs = {row: args.out / "logs" / f"mixed-{args.variant}-{row.replace(' ', '-').replace('+', 'plus')}.log" for row in rows}
        try:
            with progress.phase(f"starting {len(rows)} vLLM servers", 60 + 15 * len(rows)):
                running = stack.enter_context(
                    running_servers({row: c.for_smoke() if args.smoke else c for row, c in with_variant.items()}, model, logs)
                )
        except ServerFailed as exc:
            if args.variant != "multimodal":
                raise
            return _skip(args.out, result, f"a server did not start ({exc})")
        servers = {row: url + variant.path for row, (url, _) in running.items()}
        result["startup_s"] = time.monotonic() - started
        # Entered after the servers: every stopped one is resumed before they are stopped.
        idle = stack.enter_context(idle_servers.IdleServers(running, args.idle_servers))
        heavy_bodies = heavy()
        memory: dict[str, dict[str, float]] = {}
        for row, url in servers.items():  # warm-up, not measured
            with idle.serving(row):
                mixed.run_for(url, small, args.small_clients, warmup_s)
                mixed.run_for(url, heavy_bodies, 2, warmup_s)
                memory[row] = procstat.memory_mib(running[row][1])
        result["memory_mib"] = memory
        with progress.Progress(rounds * len(rows), f"mixed-{args.variant} blocks") as bar:
            for round_number in range(rounds):
                order = list(rows)
                shuffle.shuffle(order)
                for row in order:
                    t0 = time.monotonic()
                    with idle.serving(row):
                        block = measure(servers[row], small, heavy, traffic, heavy_traffic, seconds, ramp_s,
                                        round_number, functools.partial(idle.others_cpu, row), running[row][1],
                                        _health_port_url(health_ports.get(row)))
                    block["wall_s"] = time.monotonic() - t0
                    blocks[row].append(block)
                    bar.step(f"round {round_number + 1} {row}")
                    bar.note(
                        f"round {round_number + 1} {row} ({block['wall_s']:.0f} s): small sent "
                        f"{block['alone']['sent']} + {block['flooded']['sent']} "
                        f"(unsent {block['alone']['unsent'] + block['flooded']['unsent']}), p50 "
                        f"{block['alone']['p50_ms']:.1f} -> {block['flooded']['p50_ms']:.1f} ms, p99 "
                        f"{block['alone']['p99_ms']:.1f} -> {block['flooded']['p99_ms']:.1f} ms; heavy "
                        f"{block['heavy']['requests_per_s']:.1f}/s; /health p99 {block['health']['p99_ms']:.1f} ms; "
                        f"lost {block['alone']['lost'] + block['flooded']['lost'] + block['heavy']['lost']}; "
                        f"idle servers' CPU {block['idle_cpu_per_s']['alone']:.3f} / "
                        f"{block['idle_cpu_per_s']['flooded']:.3f} CPU-s/s",
                    )
    result.update(
        loadavg_after=_common.loadavg(), wall_s=time.monotonic() - began, blocks=blocks, summary=summarize(blocks),
        targets=[evaluate(t, blocks) for t in targets(rows, args.health_port)],
    )
    _write(args.out, result)
    print(f"wrote the results into {args.out}")
    lost = sum(c["lost"] for r in result["summary"]["rows"].values() for c in r["counts"].values())
    if lost:
        print(f"{lost} requests were sent and never answered (must be 0): see the report", file=sys.stderr)
        return 1
    return 0


def _quote(arg: str) -> str:
    return f'"{arg}"' if " " in arg else arg


def _skip(out: Path, result: dict[str, Any], reason: str) -> int:
    message = f"{result['variant']} variant skipped: {reason}"
    print(message, file=sys.stderr)
    result["skipped"] = reason
    _write(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
