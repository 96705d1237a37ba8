"""What rendering a prompt and building an embeddings answer cost, against the prices the adapter puts on them.

The vLLM adapter prices a request's work before it is done
(`offload_vllm/_cost.py`), in one unit: a character of text tokenized.
Rendering a prompt is priced at its characters plus `PROMPT_COST`
(`_seams/requests.py`, `render_params_cost`); building an answer at
`POSTPROCESS_COST_PER_OUTPUT` per engine output plus
`POSTPROCESS_COST_PER_VALUE` per output value (`_seams/serving.py`,
`postprocess_cost`). This measures both sides in one process, by this
thread's CPU clock, with vLLM's own code and the served model's config
(all-MiniLM-L6-v2's, read from the packaged model; no weights are loaded):

- rendering: vLLM's `PoolingIOProcessor.render` (an `EmbedIOProcessor` on
  a renderer built from the config, `renderer_from_config`) over every set
  of render parameters of an `/v1/embeddings` request, one call each, as
  the adapter's render call does (`_workers.render_each`). Four requests:
  one prompt of prose; one of its first half's words; as many one-word
  prompts as that prompt has words (its characters, less the spaces),
  which separates what a prompt costs from what its characters cost; and
  as many prompts of one token id each (no tokenizing). Beside it, what vLLM does for the request before
  any render call (`get_request_factory_online`, on the event loop);
- an embeddings answer: vLLM's `ServingEmbedding._postprocessing` (its
  IO processor's `post_process_online`, then `_build_response`), from
  engine outputs to the response's bytes, through the adapter's call
  (`_seams/serving.py`, `postprocess`), with the response class vLLM picks
  (`get_json_response_cls`: orjson's where orjson is installed, else
  Starlette's; the adapter's scoring encoder does not apply). Outputs of
  random unit-norm float32 vectors, as an embedding model's, of several
  counts and widths, as floats and as base64;
- the unit (`harness/unit_cost.py`): tokenizing prose with the
  all-MiniLM-L6-v2 fast tokenizer, one text per call.

Each round times the unit and every call, in a fresh random order, each
over `--repeats` calls. Per round, a call's CPU over its price times the
unit's CPU per character is at most 1 where the price bounds the work. From
the same rounds: what a prompt costs beyond its characters (the one-prompt
and the one-word requests solved for a cost per prompt and per character),
over `PROMPT_COST`; what an output value costs (the slope between two
widths at one count), over `POSTPROCESS_COST_PER_VALUE`; what an output
costs besides its values (many outputs of few values), over
`POSTPROCESS_COST_PER_OUTPUT`.

Then the hand-offs: the one-word request's first prompts rendered by a
worker of `offload.get_executor("thread")` and of `"process"` (the
adapter's render calls and worker initializers, `_workers.py`; workers at
niceness 0), awaited on an event loop, against the same render call made
on the loop, by wall-clock time: what a hand-off adds to a call, and, for
`process`, per prompt (pickled both ways).

    python -m benchmarks render-cost          # writes results/render-cost.{json,md}
    python -m benchmarks render-cost --rounds 21 --repeats 5
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import pickle
import random
import time
import warnings
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never download

from benchmarks.harness import common as _common
from benchmarks.harness import progress, unit_cost, workloads
from benchmarks.harness.models import minilm_dir
from benchmarks.harness.unit_cost import Unit, fmt, interval, quiet_imports, timed_rounds

MODEL = "all-MiniLM-L6-v2"
#: The served model's length, in tokens (its `sentence_bert_config.json`'s, as the
#: benchmarks' tiny models serve it): the one prompt of prose stays under it.
MAX_MODEL_LEN = 256
#: The words of the one prompt of prose, and so the one-word prompts' count.
WORDS = 150
#: The renders: what each request's `input` is.
RENDERS = {
    "one prompt": "one prompt of prose",
    "half a prompt": "one prompt of its first half's words",
    "a word a prompt": "each of its words a prompt of its own",
    "a token id a prompt": "as many prompts of one token id each",
}
#: The answers: (engine outputs, values each, `encoding_format`). 384 is
#: all-MiniLM-L6-v2's width, 1024 and 4096 larger models'; 256 outputs of 8
#: values are mostly what an output costs besides its values.
ANSWERS: dict[str, tuple[int, int, str]] = {
    "1 x 384 float": (1, 384, "float"),
    "32 x 384 float": (32, 384, "float"),
    "32 x 1024 float": (32, 1024, "float"),
    "1 x 4096 float": (1, 4096, "float"),
    "256 x 8 float": (256, 8, "float"),
    "32 x 1024 base64": (32, 1024, "base64"),
}
#: The two answers whose difference is 32 x 640 output values, and the answer of many small outputs.
NARROW, WIDE, MANY = "32 x 384 float", "32 x 1024 float", "256 x 8 float"
#: Prompts a hand-off carries (the one-word request's first prompts).
HANDOFF_PROMPTS = (1, 32)
#: Calls per hand-off measurement (each is a fraction of a millisecond).
HANDOFF_REPEATS = 20
STRATEGIES = ("thread", "process")


def solve_prompt_cost(one: float, many: float, one_characters: int, many_characters: int, prompts: int) -> tuple[float, float]:
    """`(per prompt, per character)`: the `a` and `b` of a prompt costing `a + b x
    characters`, from one prompt of `one_characters` costing `one` and `prompts`
    prompts of `many_characters` in all costing `many`."""
    per_prompt = (many * one_characters - one * many_characters) / (prompts * one_characters - many_characters)
    return per_prompt, (one - per_prompt) / one_characters


def slope(low: float, high: float, low_x: float, high_x: float) -> float:
    """What one more x costs, from `low` at `low_x` and `high` at `high_x`."""
    return (high - low) / (high_x - low_x)


def _vllm() -> dict[str, Any]:
    with quiet_imports():
        import torch
        from offload_vllm import _cost, _workers
        from offload_vllm._seams import config as config_seam
        from offload_vllm._seams import requests as requests_seam
        from offload_vllm._seams import serving as serving_seam
        from offload_vllm._seams.renderer import renderer_from_config
        from vllm.engine.arg_utils import EngineArgs
        from vllm.entrypoints.pooling.embed.io_processor import EmbedIOProcessor
        from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
        from vllm.entrypoints.pooling.embed.serving import ServingEmbedding
        from vllm.entrypoints.pooling.typing import PoolingServeContext
        from vllm.entrypoints.pooling.utils import get_json_response_cls
        from vllm.outputs import PoolingOutput, PoolingRequestOutput
        from vllm.renderers.chat_utils import ChatTemplateConfig

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # vLLM's own deprecation and user warnings at config time
            config = EngineArgs(
                model=str(minilm_dir()), runner="pooling", dtype="float32", max_model_len=MAX_MODEL_LEN
            ).create_engine_config()
        chat_config = ChatTemplateConfig()
        processor_cls: Any = EmbedIOProcessor  # untyped in vLLM
        io = processor_cls(vllm_config=config, renderer=renderer_from_config(config), chat_template_config=chat_config)
        # `_postprocessing` reads of its serving object only what `__init__` sets here.
        shell = object.__new__(ServingEmbedding)
        shell.json_response_cls = get_json_response_cls()
    return {
        "torch": torch, "cost": _cost, "workers": _workers, "config_seam": config_seam,
        "requests_seam": requests_seam, "serving_seam": serving_seam, "config": config, "io": io,
        "chat_config": chat_config, "shell": shell, "Request": EmbeddingCompletionRequest,
        "Context": PoolingServeContext, "PoolingOutput": PoolingOutput, "PoolingRequestOutput": PoolingRequestOutput,
    }


def _context(v: dict[str, Any], request: Any) -> Any:
    return v["Context"](
        request=request, model_name=MODEL, request_id="embd-0", lora_request=None, priorities=0,
        prompt_extras=None, pooling_params=v["io"].create_pooling_params(request),
    )


def render_inputs(words: int, seed: int) -> dict[str, list[Any]]:
    """Each render case's `input`: one text of `words` words, the text of its first
    half's words, its words, and as many one-id prompts."""
    (text,) = workloads.long_texts(1, words, seed=seed)
    return {
        "one prompt": [text],
        "half a prompt": [" ".join(text.split()[: words // 2])],
        "a word a prompt": text.split(),
        "a token id a prompt": [[1000 + i] for i in range(words)],
    }


def measure(rounds: int, repeats: int, words: int, handoff_repeats: int, seed: int) -> dict[str, Any]:
    unit_cost.tokenize_as_servers_do()
    v = _vllm()
    io, torch = v["io"], v["torch"]
    unit = Unit(seed + 1)
    rng = random.Random(seed)
    render_each = v["workers"].render_each

    renders: dict[str, dict[str, Any]] = {}
    for name, inputs in render_inputs(words, seed).items():
        ctx = _context(v, v["Request"](model=MODEL, input=inputs))
        params = list(io.get_request_factory_online(ctx))
        renders[name] = {
            "ctx": ctx, "params": params, "prompts": len(params),
            "characters": sum(len(i) for i in inputs if isinstance(i, str)),
            "price": sum(v["requests_seam"].render_params_cost(p) for p in params),
        }
    generator = torch.Generator().manual_seed(seed)
    answers: dict[str, dict[str, Any]] = {}
    for name, (count, width, encoding) in ANSWERS.items():
        vectors = [torch.randn(width, generator=generator) for _ in range(count)]
        outputs = [
            v["PoolingRequestOutput"](f"embd-0-{i}", v["PoolingOutput"](data=x / x.norm()), [101, 102], 0, True)
            for i, x in enumerate(vectors)
        ]
        ctx = _context(v, v["Request"](model=MODEL, input=["x"] * count, encoding_format=encoding))
        ctx.final_res_batch = outputs
        answers[name] = {
            "ctx": ctx, "outputs": count, "values": count * width, "encoding": encoding,
            "price": v["serving_seam"].postprocess_cost(ctx),
        }

    def render(case: dict[str, Any]) -> list[Any]:
        rendered: list[Any] = render_each(io.render, (), case["params"])
        return rendered

    def answer(case: dict[str, Any]) -> bytes:
        body: bytes = v["serving_seam"].postprocess(v["shell"], io, case["ctx"]).body
        return body

    # Each call does what it is meant to: every prompt rendered, every value in the answer.
    for name, case in renders.items():
        rendered = render(case)
        assert len(rendered) == case["prompts"], name
        assert all(r["prompts"]["prompt_token_ids"] for r in rendered), name
    for name, case in answers.items():
        data = json.loads(answer(case))["data"]
        assert len(data) == case["outputs"], name
        if case["encoding"] == "float":
            expected = [o.outputs.data.tolist() for o in case["ctx"].final_res_batch]
            assert [d["embedding"] for d in data] == expected, name
    unit.tokenize()  # warm up
    calls: dict[str, Callable[[], object]] = {"unit": unit.tokenize}
    for name, case in renders.items():
        calls[f"render/{name}"] = functools.partial(render, case)
        calls[f"prepare/{name}"] = functools.partial(io.get_request_factory_online, case["ctx"])
    for name, case in answers.items():
        calls[f"answer/{name}"] = functools.partial(answer, case)
    samples = timed_rounds(calls, rounds, repeats, rng, "render-cost rounds")
    samples["unit"] = [ns / unit.characters for ns in samples["unit"]]

    handoff_params = renders["a word a prompt"]["params"]
    return {
        "unit_characters": unit.characters,
        "prompt_cost": v["cost"].PROMPT_COST,
        "postprocess_cost_per_value": v["cost"].POSTPROCESS_COST_PER_VALUE,
        "postprocess_cost_per_output": v["cost"].POSTPROCESS_COST_PER_OUTPUT,
        "response_class": v["shell"].json_response_cls.__name__,
        "tokenizers_parallelism": os.environ["TOKENIZERS_PARALLELISM"],
        "renders": {name: {k: case[k] for k in ("prompts", "characters", "price")} for name, case in renders.items()},
        "answers": {
            name: {k: case[k] for k in ("outputs", "values", "encoding", "price")} for name, case in answers.items()
        },
        "samples": samples,
        "handoffs": asyncio.run(handoffs(v, handoff_params, rounds, handoff_repeats, rng)),
    }


async def handoffs(
    v: dict[str, Any], params: list[Any], rounds: int, repeats: int, rng: random.Random
) -> dict[str, Any]:
    """Wall-clock ns per render call of the first `n` of `params` (each of
    `HANDOFF_PROMPTS`, at most all of them), made on this loop and handed to
    a worker of each of `STRATEGIES`, in a fresh random order each round."""
    import offload

    workers, io = v["workers"], v["io"]
    sizes = sorted({min(n, len(params)) for n in HANDOFF_PROMPTS})
    spec = workers.IOProcessorSpec(type(io), v["chat_config"])
    executors = {
        "thread": offload.get_executor("thread", max_workers=1, nice=0, initializer=workers.init_thread_worker),
        "process": offload.get_executor(
            "process", max_workers=1, nice=0, initializer=workers.init_remote_worker,
            initargs=(v["config_seam"].without_live_model(v["config"]), False, False),
        ),
    }
    leads = {"thread": (workers.render_in_thread, (io,)), "process": (workers.render_in_process, (spec,))}
    pickled = {n: len(pickle.dumps(params[:n])) + len(pickle.dumps(workers.render_each(io.render, (), params[:n])))
               for n in sizes}

    async def call(where: str, n: int) -> None:
        if where == "inline":
            workers.render_each(io.render, (), params[:n])
        else:
            fn, lead = leads[where]
            await executors[where].run(workers.render_each, fn, lead, params[:n])

    samples: dict[str, list[float]] = {f"{where}/{n}": [] for where in ("inline", *STRATEGIES) for n in sizes}
    try:
        for where in STRATEGIES:  # a worker starts, and builds its renderer, before anything is timed
            await call(where, sizes[-1])
        with progress.Progress(rounds, "render-cost hand-offs") as bar:
            for _ in range(rounds):
                order = list(samples)
                rng.shuffle(order)
                for key in order:
                    where, n = key.split("/")
                    start = time.perf_counter_ns()
                    for _ in range(repeats):
                        await call(where, int(n))
                    samples[key].append((time.perf_counter_ns() - start) / repeats)
                bar.step()
    finally:
        for executor in executors.values():
            await executor.aclose()
    return {"sizes": sizes, "repeats": repeats, "pickled_bytes": pickled, "samples": samples}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Medians [intervals] of what the report shows, each ratio paired per round with its round's unit."""
    s = result["samples"]
    unit = s["unit"]
    out: dict[str, Any] = {"unit": {"ns_per_character": interval(unit)}, "renders": {}, "answers": {}}
    for name, case in result["renders"].items():
        rendered, prepared = s[f"render/{name}"], s[f"prepare/{name}"]
        out["renders"][name] = {
            "render_ms": interval([x / 1e6 for x in rendered]),
            "render_over_its_price": interval([x / (case["price"] * u) for x, u in zip(rendered, unit, strict=True)]),
            "prepare_ms": interval([x / 1e6 for x in prepared]),
            "both_over_its_price": interval(
                [(x + p) / (case["price"] * u) for x, p, u in zip(rendered, prepared, unit, strict=True)]
            ),
        }
    one, many = result["renders"]["one prompt"], result["renders"]["a word a prompt"]
    split = [
        solve_prompt_cost(a / u, b / u, one["characters"], many["characters"], many["prompts"])
        for a, b, u in zip(s["render/one prompt"], s["render/a word a prompt"], unit, strict=True)
    ]
    # The same two costs from two prompts' lengths alone (no one-word prompts):
    # what a character of prose costs, and what is left of the long prompt.
    half = result["renders"]["half a prompt"]
    per_character = [
        slope(h / u, a / u, half["characters"], one["characters"])
        for h, a, u in zip(s["render/half a prompt"], s["render/one prompt"], unit, strict=True)
    ]
    beside = [a / u - b * one["characters"] for a, b, u in zip(s["render/one prompt"], per_character, unit, strict=True)]
    prompt_cost = result["prompt_cost"]
    out["prompt"] = {
        "units_per_prompt": interval([a for a, _ in split]),
        "over_price": interval([a / prompt_cost for a, _ in split]),
        "units_per_character": interval([b for _, b in split]),
        "units_per_character_by_length": interval(per_character),
        "units_per_prompt_by_length": interval(beside),
    }
    for name, case in result["answers"].items():
        built = s[f"answer/{name}"]
        out["answers"][name] = {
            "answer_ms": interval([x / 1e6 for x in built]),
            "answer_over_its_price": interval([x / (case["price"] * u) for x, u in zip(built, unit, strict=True)]),
        }
    narrow, wide, many_small = (result["answers"][n] for n in (NARROW, WIDE, MANY))
    per_value = [
        slope(a / u, b / u, narrow["values"], wide["values"])
        for a, b, u in zip(s[f"answer/{NARROW}"], s[f"answer/{WIDE}"], unit, strict=True)
    ]
    per_output = [
        x / u / many_small["outputs"] - many_small["values"] / many_small["outputs"] * value
        for x, u, value in zip(s[f"answer/{MANY}"], unit, per_value, strict=True)
    ]
    out["value"] = {
        "units_per_value": interval(per_value),
        "over_price": interval([x / result["postprocess_cost_per_value"] for x in per_value]),
    }
    out["output"] = {
        "units_per_output": interval(per_output),
        "over_price": interval([x / result["postprocess_cost_per_output"] for x in per_output]),
    }
    h = result["handoffs"]
    low, high = h["sizes"][0], h["sizes"][-1]
    out["handoffs"] = {}
    for where in STRATEGIES:
        added = {
            n: [x - i for x, i in zip(h["samples"][f"{where}/{n}"], h["samples"][f"inline/{n}"], strict=True)]
            for n in h["sizes"]
        }
        entry = {f"added_us/{n}": interval([x / 1e3 for x in added[n]]) for n in h["sizes"]}
        if high > low:
            entry["added_us_per_prompt"] = interval(
                [slope(a, b, low, high) / 1e3 for a, b in zip(added[low], added[high], strict=True)]
            )
        out["handoffs"][where] = entry
    return out


def markdown(result: dict[str, Any]) -> str:
    info, s = result["machine"], result["summary"]
    unit = s["unit"]["ns_per_character"]
    renders = _common.table(
        ["request", "prompts", "characters", "price (units)", "render CPU (ms)", "that / its price (paired)",
         "preparing its render parameters, on the loop (ms)", "both / its price (paired)"],
        [
            [f"{name}: {RENDERS[name]}", case["prompts"], f"{case['characters']:,}", f"{case['price']:,.0f}",
             fmt(s["renders"][name]["render_ms"], 3), fmt(s["renders"][name]["render_over_its_price"], 2),
             fmt(s["renders"][name]["prepare_ms"], 3), fmt(s["renders"][name]["both_over_its_price"], 2)]
            for name, case in result["renders"].items()
        ],
    )
    answers = _common.table(
        ["outputs x values, encoding", "price (units)", "answer CPU (ms)", "that / its price (paired)"],
        [
            [name, f"{case['price']:,.0f}", fmt(s["answers"][name]["answer_ms"], 3),
             fmt(s["answers"][name]["answer_over_its_price"], 2)]
            for name, case in result["answers"].items()
        ],
    )
    h = result["handoffs"]
    handoff_rows = []
    for where in STRATEGIES:
        entry = s["handoffs"][where]
        handoff_rows.append(
            [f"`{where}`", *(fmt(entry[f"added_us/{n}"], 0) for n in h["sizes"]),
             fmt(entry["added_us_per_prompt"], 1) if "added_us_per_prompt" in entry else ""]
        )
    handoffs = _common.table(
        ["strategy", *(f"added to a render call of {n} prompt{'s' if n > 1 else ''} (µs)" for n in h["sizes"]),
         "per prompt more (µs)"],
        handoff_rows,
    )
    p, value, output = s["prompt"], s["value"], s["output"]
    return (
        _common.header("What rendering a prompt and building an embeddings answer cost, against their prices", info)
        + "<!-- --8<-- [start:tables] -->\n"
        + f"`{result['command']}` at commit `{info['commit'] or 'uncommitted'}`: {result['rounds']} rounds of "
        f"{result['repeats']} calls per measurement, in a random order each round, CPU time of this thread; "
        f"medians over rounds [order-statistic intervals, coverage {100 * unit[3]:.1f}%]. The unit: the "
        f"all-MiniLM-L6-v2 fast tokenizer on prose, one text per call, {fmt(unit, 0)} ns a character "
        f"(`TOKENIZERS_PARALLELISM={result['tokenizers_parallelism']}`, as the benchmarks' servers run); each "
        "figure in units is paired with its round's unit. A price bounds the work where a ratio to it is at "
        "most 1.\n\n"
        f"**Rendering** (vLLM's `PoolingIOProcessor.render`, one call per prompt, as the adapter's render call "
        f"makes them; priced `render_params_cost`: characters plus {result['prompt_cost']} a prompt, 1 a token "
        "id). Preparing the render parameters (`get_request_factory_online`) is vLLM's work on the loop "
        "before any render call.\n\n"
        + renders
        + f"\nA prompt beyond its characters (the first two requests solved for a cost per prompt and per "
        f"character): **{fmt(p['units_per_prompt'], 1)} units**, {fmt(p['over_price'], 2)} of `PROMPT_COST` "
        f"({result['prompt_cost']}); a character of it, {fmt(p['units_per_character'], 2)} units. From the two "
        f"prompts of prose alone (the slope between their lengths): a character, "
        f"{fmt(p['units_per_character_by_length'], 2)} units; a prompt beyond it, "
        f"{fmt(p['units_per_prompt_by_length'], 1)} units.\n\n"
        f"**An embeddings answer** (vLLM's `ServingEmbedding._postprocessing`, to the response's bytes, with "
        f"`{result['response_class']}`; priced `postprocess_cost`: {result['postprocess_cost_per_output']:g} an "
        f"output and {result['postprocess_cost_per_value']:g} a value).\n\n"
        + answers
        + f"\nAn output value ({WIDE} less {NARROW}, per value): **{fmt(value['units_per_value'], 2)} units**, "
        f"{fmt(value['over_price'], 2)} of `POSTPROCESS_COST_PER_VALUE`; an output besides its values ({MANY}, "
        f"less its values at that rate): **{fmt(output['units_per_output'], 1)} units**, "
        f"{fmt(output['over_price'], 2)} of `POSTPROCESS_COST_PER_OUTPUT`.\n\n"
        f"**Hand-offs** (the one-word request's first prompts rendered by one worker of "
        f"`offload.get_executor(...)` at niceness 0, awaited on an event loop, less the same render call made "
        f"on the loop; wall-clock time, {h['repeats']} calls per measurement, the same rounds' medians "
        f"[intervals]; pickled both ways under `process`: {', '.join(f'{b:,} bytes for {n}' for n, b in h['pickled_bytes'].items())}).\n\n"
        + handoffs
        + "<!-- --8<-- [end:tables] -->\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = unit_cost.parser(__doc__, "render-cost")
    args = p.parse_args(argv)
    rounds, repeats, words, handoff_repeats = (
        (3, 1, 20, 1) if args.smoke else (args.rounds, args.repeats, WORDS, HANDOFF_REPEATS)
    )
    return unit_cost.run(
        p, args, argv, "render-cost", lambda: measure(rounds, repeats, words, handoff_repeats, args.seed),
        summary, markdown, rounds=rounds, repeats=repeats, words=words,
    )


if __name__ == "__main__":
    raise SystemExit(main())
