"""What building a rerank answer costs per character it echoes, against the price the adapter puts on it.

A rerank answer carries every document back. The vLLM adapter prices
building a response before it is built (`offload_vllm/_seams/serving.py`,
`postprocess_cost`): `POSTPROCESS_COST_PER_VALUE` per output value and
`ECHO_COST_PER_CHARACTER` per character of the request the answer echoes,
in the unit every price is counted in, a character of text tokenized
(`offload_vllm/_cost.py`). This measures both sides in one process, by this
thread's CPU clock (`time.thread_time_ns`):

- an answer: vLLM's own `ServingScores._request_output_to_rerank_response`,
  from engine outputs (one score per document) to the response's bytes,
  with the adapter's `ScoringJSONResponse` as the module's `JSONResponse`
  (what `install_response_encoder` sets; patched here, not installed, so
  that this process's vLLM stays as it was). It encodes with pydantic-core
  where `same_bytes_in_pydantic_core` accepts the answer, and with
  Starlette's encoder where it refuses it: here, one score below 1e-4,
  which Python writes with an exponent. Documents of three kinds, 32 of them
  of the rerank benchmark's lengths (`workloads.rerank_factory`, ~930,000
  characters): its prose; multilingual text (several scripts, `nmt_nfkc`'s
  rewrites); and the worst case for both encoders, control characters
  (escaped: six bytes, `\\u0001`, or two, `\\n`) mixed with emoji (four bytes of
  UTF-8 each, and a string Python stores four bytes a character); and, for
  what an answer costs beside its text, as many documents of no characters;
- the unit: tokenizing prose, one text per call, with the all-MiniLM-L6-v2
  fast tokenizer (`harness/unit_cost.py`, shared with `render-cost`).

Each round times the unit and every answer, in a fresh random order, each
over `--repeats` calls. Per round, an answer's CPU per echoed character over
the unit's CPU per character is what an echoed character costs in units;
over `ECHO_COST_PER_CHARACTER` it is at most 1 where the price bounds the
work. The report gives medians over rounds with order-statistic intervals,
and the whole answer's CPU over its price (values and characters) in the
same unit.

    python -m benchmarks echo-cost          # writes results/echo-cost.{json,md}
    python -m benchmarks echo-cost --rounds 21 --repeats 5
"""

from __future__ import annotations

import functools
import json
import os
import random
import types
from collections.abc import Callable
from typing import Any
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never download

from benchmarks.harness import common as _common
from benchmarks.harness import unit_cost, workloads
from benchmarks.harness.models import multilingual_text
from benchmarks.harness.unit_cost import (
    MICROSECONDS_PER_UNIT,
    UNIT_WORDS,
    Unit,
    fmt,
    interval,
    quiet_imports,
    timed_rounds,
)

MODEL = "tiny-bert-cross-encoder"
#: The rerank benchmark's documents: 32 of 5,000 words (`workloads.rerank_factory`).
DOCUMENTS, WORDS = 32, 5000
#: A score the adapter's encoder refuses (Python writes it with an exponent), so that
#: the answer holding it is encoded by Starlette's.
REFUSED_SCORE = 1e-5

KINDS = {
    "prose": "the rerank benchmark's documents (English words, ASCII)",
    "multilingual": "several scripts and the characters `nmt_nfkc` rewrites (`models.multilingual_text`)",
    "escapes": "control characters (escaped in JSON: six bytes, or two) mixed with emoji (four bytes of UTF-8)",
    "empty": "as many documents, of no characters: what the answer costs beside its text",
}
ENCODERS = {"pydantic-core": "accepted", "Starlette": "refused (one score below 1e-4)"}


def documents(kind: str, count: int, words: int) -> list[str]:
    """`count` documents of `kind`, each as long as the rerank benchmark's prose document of its rank."""
    prose = workloads.long_texts(count, words)
    if kind == "empty":
        return [""] * count
    if kind == "prose":
        return prose
    rng = random.Random(kind)
    if kind == "multilingual":
        out = []
        for i, text in enumerate(prose):
            many = multilingual_text(words, seed=i)
            while len(many) < len(text):
                many += many
            out.append(many[: len(text)])
        return out
    pool = [chr(c) for c in range(1, 0x20)] + [chr(c) for c in range(0x1F600, 0x1F650)]
    return ["".join(rng.choices(pool, k=len(text))) for text in prose]


def _vllm() -> dict[str, Any]:
    with quiet_imports():
        import torch
        from offload_vllm import _cost
        from offload_vllm._seams import responses
        from offload_vllm._seams.serving import postprocess_cost
        from vllm.entrypoints.pooling.scoring import serving as scoring_serving
        from vllm.entrypoints.pooling.scoring.protocol import RerankRequest
        from vllm.outputs import PoolingOutput, PoolingRequestOutput
    return {
        "torch": torch, "cost": _cost, "responses": responses, "postprocess_cost": postprocess_cost,
        "scoring_serving": scoring_serving, "RerankRequest": RerankRequest,
        "PoolingOutput": PoolingOutput, "PoolingRequestOutput": PoolingRequestOutput,
    }


def measure(rounds: int, repeats: int, count: int, words: int, seed: int) -> dict[str, Any]:
    unit_cost.tokenize_as_servers_do()
    v = _vllm()
    serving_cls = v["scoring_serving"].ServingScores
    # `_request_output_to_rerank_response` reads nothing of its serving object.
    shell = object.__new__(serving_cls)
    unit = Unit(seed + 1)
    rng = random.Random(seed)

    def outputs(scores: list[float]) -> list[Any]:
        return [
            v["PoolingRequestOutput"](f"rerank-{i}", v["PoolingOutput"](data=v["torch"].tensor([score])), [], 0, True)
            for i, score in enumerate(scores)
        ]

    cases: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        texts = documents(kind, count, words)
        scores = [rng.uniform(0.01, 0.99) for _ in texts]
        request = v["RerankRequest"](model=MODEL, query="which passage says the most?", documents=texts)
        for encoder in ENCODERS:
            batch = outputs(scores if encoder == "pydantic-core" else [*scores[:-1], REFUSED_SCORE])
            ctx = types.SimpleNamespace(request=request, final_res_batch=batch)
            cases[f"{kind}/{encoder}"] = {
                "kind": kind, "encoder": encoder, "documents": texts, "outputs": batch,
                "echoed": sum(map(len, texts)), "price": v["postprocess_cost"](ctx),
            }

    def answer(case: dict[str, Any]) -> bytes:
        response = serving_cls._request_output_to_rerank_response(
            shell, case["outputs"], "rerank-0", MODEL, case["documents"], len(case["documents"]), 0
        )
        body: bytes = response.body
        return body

    with mock.patch.object(v["scoring_serving"], "JSONResponse", v["responses"].ScoringJSONResponse):
        for name, case in cases.items():  # each answer takes the encoder it is meant to
            content = json.loads(answer(case))
            taken = "pydantic-core" if v["responses"].same_bytes_in_pydantic_core(content) else "Starlette"
            assert taken == case["encoder"], (name, taken)
            assert sorted(r["document"]["text"] for r in content["results"]) == sorted(case["documents"]), name
        unit.tokenize()  # warm up
        calls: dict[str, Callable[[], object]] = {"unit": unit.tokenize}
        calls |= {name: functools.partial(answer, case) for name, case in cases.items()}
        samples = timed_rounds(calls, rounds, repeats, rng, "echo-cost rounds")
    samples["unit"] = [ns / unit.characters for ns in samples["unit"]]
    return {
        "unit_characters": unit.characters,
        "echo_cost_per_character": v["cost"].ECHO_COST_PER_CHARACTER,
        "postprocess_cost_per_value": v["cost"].POSTPROCESS_COST_PER_VALUE,
        "cases": {name: {k: case[k] for k in ("kind", "encoder", "echoed", "price")} for name, case in cases.items()},
        "samples": samples,
    }


def summary(result: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Per answer: ns per echoed character, that in units, that over the price,
    the whole answer over its price (paired with its round's unit), and the unit."""
    unit = result["samples"]["unit"]
    price = result["echo_cost_per_character"]
    out: dict[str, dict[str, list[float]]] = {}
    for name, case in result["cases"].items():
        answers = result["samples"][name]
        series = {
            "answer_ms": [a / 1e6 for a in answers],
            "answer_over_its_price": [a / (case["price"] * u) for a, u in zip(answers, unit, strict=True)],
        }
        if case["echoed"]:
            per_character = [a / case["echoed"] for a in answers]
            in_units = [c / u for c, u in zip(per_character, unit, strict=True)]
            series |= {
                "ns_per_character": per_character,
                "units_per_character": in_units,
                "over_price": [x / price for x in in_units],
            }
        out[name] = {key: interval(values) for key, values in series.items()}
    out["unit"] = {"ns_per_character": interval(unit)}
    return out


def markdown(result: dict[str, Any]) -> str:
    info, s = result["machine"], result["summary"]
    unit = s["unit"]["ns_per_character"]
    price = result["echo_cost_per_character"]
    rows = [
        [f"{case['kind']}: {KINDS[case['kind']]}", f"{case['encoder']} ({ENCODERS[case['encoder']]})",
         f"{case['echoed']:,}", f"{case['price']:,.0f}", fmt(s[name]["answer_ms"], 2),
         *([fmt(s[name]["ns_per_character"], 1), fmt(s[name]["units_per_character"], 4),
            fmt(s[name]["over_price"], 2)] if case["echoed"] else ["", "", ""]),
         fmt(s[name]["answer_over_its_price"], 2)]
        for name, case in result["cases"].items()
    ]
    table = _common.table(
        ["documents", "encoder", "echoed characters", "price (units)", "answer CPU (ms)",
         "ns per echoed character", "units per echoed character (paired)",
         f"that / {price} (paired)", "answer / its price (paired)"],
        rows,
    )
    return (
        _common.header("What a rerank answer costs per character it echoes, against its price", info)
        + "<!-- --8<-- [start:tables] -->\n"
        + f"`{result['command']}` at commit `{info['commit'] or 'uncommitted'}`: {result['rounds']} rounds of "
        f"{result['repeats']} calls per measurement, in a random order each round, CPU time of this thread; "
        "medians over rounds [order-statistic intervals, coverage "
        f"{100 * unit[3]:.1f}%]. An answer: vLLM's `_request_output_to_rerank_response` with the adapter's "
        f"`ScoringJSONResponse`, {result['documents']} documents, to the response's bytes. The unit: the "
        f"all-MiniLM-L6-v2 fast tokenizer on prose, one text of ~{UNIT_WORDS} words per call, "
        f"{fmt(unit, 0)} ns a character (the constants use {MICROSECONDS_PER_UNIT * 1000:.0f}); each answer's "
        "figures in units are paired with its round's unit. A price bounds the work where the last two "
        "columns are at most 1.\n\n"
        + table
        + "<!-- --8<-- [end:tables] -->\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = unit_cost.parser(__doc__, "echo-cost")
    args = p.parse_args(argv)
    rounds, repeats, count, words = (3, 1, 2, 50) if args.smoke else (args.rounds, args.repeats, DOCUMENTS, WORDS)
    return unit_cost.run(
        p, args, argv, "echo-cost", lambda: measure(rounds, repeats, count, words, args.seed), summary, markdown,
        rounds=rounds, repeats=repeats, documents=count,
    )


if __name__ == "__main__":
    raise SystemExit(main())
