"""What pricing a request costs the event loop, against what parsing it already costs there.

The vLLM adapter prices every pooling request on the API server's event loop
before anything is rendered (`offload_vllm/_seams/requests.py`,
`request_cost`), so that admission and lanes can charge it. For a truncated
text that walk also finds where prefix tokenization may cut it
(`_prefix.read_bound`), reading up to `2 * _WINDOW` first guesses of each
text (and two thirds of it). This measures that price's own CPU time per request, in this process
with prefix tokenization on as in a server's default settings, beside the
work the loop does for the same body anyway: `json.loads` and vLLM's
pydantic validation of an `EmbeddingRequest`, as FastAPI does before the
handler runs, and the same parsing as the adapter's servers do it, without
the union members that a value in `input` rules out
(`offload_vllm/_seams/validation.py`). Each round runs the request shapes in a fresh random order,
and per shape alternates parsing and pricing, each timed over `--repeats`
calls by this thread's CPU clock (`time.thread_time_ns`); the report gives
medians over rounds with order-statistic intervals, and the paired ratio
pricing / parsing per round.

    python -m benchmarks pricing                 # writes results/pricing.{json,md}
    python -m benchmarks pricing --rounds 15 --repeats 100
"""

from __future__ import annotations

import functools
import json
import random
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pydantic

from benchmarks.harness import common as _common
from benchmarks.harness import progress, workloads
from benchmarks.harness.stats import median_interval

ROOT = Path(__file__).resolve().parents[2]

MODEL = "tiny"

def shapes() -> dict[str, tuple[str, dict[str, Any]]]:
    """Name -> (what it is, request body); the first is `bench_mixed`'s heavy request."""
    texts = workloads.long_texts(16, 1500, seed=1000)
    no_whitespace = [text.replace(" ", ",") for text in texts]
    return {
        "truncated": ("16 texts of 1500 words, `truncate_prompt_tokens: 32`",
                      {"model": MODEL, "input": texts, "truncate_prompt_tokens": 32}),
        "whole": ("the same texts, untruncated", {"model": MODEL, "input": texts}),
        "no safe cut": ("the same texts with commas for spaces, truncated to 32 (priced whole)",
                        {"model": MODEL, "input": no_whitespace, "truncate_prompt_tokens": 32}),
        "one long text": ("one text of 24,000 words, truncated to 32",
                          {"model": MODEL, "input": " ".join(texts), "truncate_prompt_tokens": 32}),
        "token ids": ("16 lists of 512 token ids", {"model": MODEL, "input": [list(range(1000, 1512))] * 16}),
    }


def _vllm() -> tuple[Any, Any, Callable[..., float], Any]:
    # vLLM's import warns (torch deprecations); under pytest's warnings-as-errors
    # that would fail the smoke run when no vLLM test imported it first.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from offload_vllm._seams.requests import request_cost
        from offload_vllm._seams.validation import UnionShortcut
        from vllm.entrypoints.pooling.embed.protocol import (
            EmbeddingCompletionRequest,
            EmbeddingRequest,
        )
    return EmbeddingRequest, EmbeddingCompletionRequest, request_cost, UnionShortcut


def cpu_us_per_call(call: Callable[[], object], repeats: int) -> float:
    start = time.thread_time_ns()
    for _ in range(repeats):
        call()
    return (time.thread_time_ns() - start) / repeats / 1e3


def measure(rounds: int, repeats: int, seed: int) -> dict[str, Any]:
    request_type, completion_type, request_cost, union_shortcut = _vllm()
    validator = pydantic.TypeAdapter(request_type)
    shortcut = union_shortcut(request_type, [])
    bodies = {name: json.dumps(body).encode() for name, (_, body) in shapes().items()}

    def parse(body: bytes) -> Any:
        return validator.validate_python(json.loads(body))

    def full(value: Any, values: dict[str, Any], *, loc: tuple[Any, ...]) -> tuple[Any, list[Any]]:
        return validator.validate_python(value), []

    def parse_with_shortcut(body: bytes) -> Any:
        return shortcut.validate(json.loads(body), full, {}, loc=("body",))[0]

    def parse_as_completion(body: bytes) -> Any:
        # The one model of the union that takes every shape here: what
        # validation costs without the union's other tries.
        return completion_type.model_validate(json.loads(body))

    parsed = {name: parse(body) for name, body in bodies.items()}
    rng = random.Random(seed)
    samples: dict[str, dict[str, list[float]]] = {
        name: {"parse": [], "parse_shortcut": [], "parse_one_model": [], "price": []} for name in bodies
    }
    # Pricing reads only whether prefix tokenization is on (`prefix_installed`):
    # on, as in a server with the default settings. Patched, not installed, so
    # that this process's vLLM classes stay as they were (the smoke run shares
    # its process with the test suite).
    for name, body in bodies.items():  # the same request, however parsed
        assert parse_with_shortcut(body) == parsed[name].model_copy(update={"request_id": mock.ANY}), name
    with mock.patch("offload_vllm._seams.requests.prefix_installed", return_value=True):
        prices = {name: request_cost(parsed[name], len(body)) for name, body in bodies.items()}
        bar = progress.Progress(rounds, "pricing rounds")
        for _ in range(rounds):
            order = list(bodies)
            rng.shuffle(order)
            for name in order:
                body, request = bodies[name], parsed[name]
                samples[name]["parse"].append(cpu_us_per_call(functools.partial(parse, body), repeats))
                samples[name]["parse_shortcut"].append(
                    cpu_us_per_call(functools.partial(parse_with_shortcut, body), repeats)
                )
                samples[name]["parse_one_model"].append(
                    cpu_us_per_call(functools.partial(parse_as_completion, body), repeats)
                )
                samples[name]["price"].append(
                    cpu_us_per_call(functools.partial(request_cost, request, len(body)), repeats)
                )
            bar.step()
        bar.close()
    return {
        "bytes": {name: len(body) for name, body in bodies.items()},
        "prices": prices,
        "samples_us": samples,
    }


def summary(result: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    out = {}
    for name, sample in result["samples_us"].items():
        ratios = [p / q for p, q in zip(sample["price"], sample["parse"], strict=True)]
        shortcut = [p / q for p, q in zip(sample["parse_shortcut"], sample["parse"], strict=True)]
        for key, values in (("parse", sample["parse"]), ("parse_one_model", sample["parse_one_model"]),
                            ("price", sample["price"]), ("ratio", ratios),
                            ("parse_shortcut", sample["parse_shortcut"]), ("shortcut_ratio", shortcut)):
            found = median_interval(values)
            out.setdefault(name, {})[key] = [found.median, found.low, found.high, found.coverage]
    return out


def _fmt(interval: list[float], digits: int) -> str:
    median, low, high, _ = interval
    return f"{median:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def markdown(result: dict[str, Any]) -> str:
    info = result["machine"]
    described = {name: what for name, (what, _) in shapes().items()}
    lines = [
        "# Pricing a request on the event loop", "",
        "<!-- --8<-- [start:tables] -->",
        (f"`{result['command']}` on {info['cpus']} CPUs ({info['platform']}), {info['date']}, commit "
        f"`{info['commit']}`: {result['rounds']} rounds of {result['repeats']} calls per shape, CPU time of "
        f"this thread; medians over rounds [order-statistic intervals, coverage "
        f"{100 * next(iter(result['summary'].values()))['ratio'][3]:.1f}%]. Parsing: `json.loads` and vLLM's "
        "`EmbeddingRequest` validation, as FastAPI does on the loop; pricing: the adapter's `request_cost` "
        "with prefix tokenization on, as admission charges. With the shortcut: parsing as the adapter's "
        "servers do it, without the union's chat-input models where a value in `input` rules them out. "
        "The last column validates the same body as the one model of vLLM's union that accepts it, "
        "for reference."),
        "",
        ("| request | body (KB) | price (characters) | parsing (µs) | pricing (µs) | pricing / parsing, paired "
        "| parsing with the shortcut (µs) | with the shortcut / without, paired "
        "| parsing as `EmbeddingCompletionRequest` alone (µs) |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in result["summary"].items():
        lines.append(
            f"| {name}: {described[name]} | {result['bytes'][name] / 1024:.0f} | {result['prices'][name]:,.0f} | "
            f"{_fmt(s['parse'], 0)} | {_fmt(s['price'], 1)} | {_fmt(s['ratio'], 3)}x | "
            f"{_fmt(s['parse_shortcut'], 0)} | {_fmt(s['shortcut_ratio'], 3)}x | {_fmt(s['parse_one_model'], 0)} |"
        )
    lines += ["<!-- --8<-- [end:tables] -->", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(__doc__.splitlines()[0], "pricing")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rounds, repeats = (3, 2) if args.smoke else (args.rounds, args.repeats)
    if rounds < 1 or repeats < 1:
        p.error("--rounds and --repeats must be at least 1")
    result: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks pricing", *(argv if argv is not None else sys.argv[1:])]),
        "machine": _common.machine(), "rounds": rounds, "repeats": repeats,
        **measure(rounds, repeats, args.seed),
    }
    result["summary"] = summary(result)
    text = markdown(result)
    _common.write(args.out, "pricing", result, text)
    print(f"wrote the results into {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
