"""`render-cost`: its requests, its arithmetic, its report and its arguments
(the measurement itself runs in the smoke test)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from benchmarks.calibration import render_cost
from benchmarks.harness.common import RESULTS as ALL_RESULTS

RESULTS = ALL_RESULTS / "render-cost"


def test_the_one_word_prompts_are_the_one_prompts_characters_less_its_spaces() -> None:
    inputs = render_cost.render_inputs(40, seed=3)
    (text,) = inputs["one prompt"]
    words = inputs["a word a prompt"]
    assert len(words) == 40
    assert " ".join(words) == text
    assert sum(map(len, words)) == len(text) - 39
    assert inputs["a token id a prompt"] == [[1000 + i] for i in range(40)]
    assert inputs["half a prompt"] == [" ".join(words[:20])]


@pytest.mark.parametrize(("per_prompt", "per_character"), [(50.0, 1.0), (128.0, 1.2), (0.0, 0.9), (300.0, 0.5)])
def test_a_prompts_cost_is_solved_from_one_prompt_and_many(per_prompt: float, per_character: float) -> None:
    one_characters, many_characters, prompts = 1_800, 1_500, 300
    one = per_prompt + per_character * one_characters
    many = prompts * per_prompt + per_character * many_characters
    solved = render_cost.solve_prompt_cost(one, many, one_characters, many_characters, prompts)
    assert solved == pytest.approx((per_prompt, per_character))


def test_slope() -> None:
    assert render_cost.slope(10.0, 30.0, 100, 200) == pytest.approx(0.2)


def _result(unit_ns: list[float], per_prompt: float, per_character: float, per_value: float, per_output: float) -> dict[str, Any]:
    """A result whose every sample is what the given costs (in units) make
    it, at each round's unit, plus a little noise that the pairing cancels."""
    rng = random.Random(0)
    renders = {
        "one prompt": {"prompts": 1, "characters": 1_800, "price": 1_800 + 128.0},
        "half a prompt": {"prompts": 1, "characters": 900, "price": 900 + 128.0},
        "a word a prompt": {"prompts": 300, "characters": 1_500, "price": 1_500 + 300 * 128.0},
        "a token id a prompt": {"prompts": 300, "characters": 0, "price": 300 * 129.0},
    }
    answers = {
        name: {"outputs": count, "values": count * width, "encoding": encoding,
               "price": count * 40.0 + count * width * 1.5}
        for name, (count, width, encoding) in render_cost.ANSWERS.items()
    }
    samples: dict[str, list[float]] = {"unit": unit_ns}
    for name, case in renders.items():
        units = case["prompts"] * per_prompt + case["characters"] * per_character
        samples[f"render/{name}"] = [units * u for u in unit_ns]
        samples[f"prepare/{name}"] = [case["prompts"] * 5.0 * u for u in unit_ns]
    for name, case in answers.items():
        units = case["outputs"] * per_output + case["values"] * per_value
        samples[f"answer/{name}"] = [units * u for u in unit_ns]
    handoff: dict[str, list[float]] = {}
    for n in (1, 32):
        inline = [n * 20_000.0 + rng.uniform(0, 100) for _ in unit_ns]
        handoff[f"inline/{n}"] = inline
        handoff[f"thread/{n}"] = [x + 30_000.0 for x in inline]
        handoff[f"process/{n}"] = [x + 300_000.0 + n * 25_000.0 for x in inline]
    return {
        "command": "python -m benchmarks render-cost", "rounds": len(unit_ns), "repeats": 5, "words": 300,
        "machine": {"date": "2026-11-28T00:00:00+00:00", "cpus": 2, "platform": "Linux", "python": "3.11",
                    "commit": "abc1234", "versions": {}},
        "unit_characters": 28_000, "prompt_cost": 128, "postprocess_cost_per_value": 1.5,
        "postprocess_cost_per_output": 40.0, "response_class": "JSONResponse",
        "tokenizers_parallelism": "false",
        "renders": renders, "answers": answers, "samples": samples,
        "handoffs": {"sizes": [1, 32], "repeats": 20, "pickled_bytes": {1: 900, 32: 20_000}, "samples": handoff},
    }


def test_the_summary_recovers_the_costs_the_samples_were_made_of() -> None:
    unit_ns = [290.0, 310.0, 300.0, 350.0, 280.0, 305.0, 320.0]
    result = _result(unit_ns, per_prompt=64.0, per_character=1.1, per_value=0.75, per_output=12.0)
    s = render_cost.summary(result)
    assert s["prompt"]["units_per_prompt"][:3] == pytest.approx([64.0] * 3)
    assert s["prompt"]["over_price"][:3] == pytest.approx([0.5] * 3)
    assert s["prompt"]["units_per_character"][:3] == pytest.approx([1.1] * 3)
    assert s["prompt"]["units_per_character_by_length"][:3] == pytest.approx([1.1] * 3)
    assert s["prompt"]["units_per_prompt_by_length"][:3] == pytest.approx([64.0] * 3)
    assert s["value"]["units_per_value"][:3] == pytest.approx([0.75] * 3)
    assert s["value"]["over_price"][:3] == pytest.approx([0.5] * 3)
    assert s["output"]["units_per_output"][:3] == pytest.approx([12.0] * 3)
    assert s["output"]["over_price"][:3] == pytest.approx([0.3] * 3)
    one = s["renders"]["one prompt"]["render_over_its_price"]
    assert one[:3] == pytest.approx([(64.0 + 1.1 * 1_800) / (1_800 + 128)] * 3)
    assert s["handoffs"]["thread"]["added_us/1"][0] == pytest.approx(30.0)
    assert s["handoffs"]["process"]["added_us/32"][0] == pytest.approx(300.0 + 32 * 25.0)
    assert s["handoffs"]["process"]["added_us_per_prompt"][:3] == pytest.approx([25.0] * 3)
    assert s["unit"]["ns_per_character"][0] == pytest.approx(305.0)


def test_the_report_states_the_prices_against_the_work() -> None:
    result = _result([300.0] * 5, per_prompt=64.0, per_character=1.0, per_value=0.75, per_output=12.0)
    result["summary"] = render_cost.summary(result)
    report = render_cost.markdown(result)
    assert "[start:tables]" in report
    assert "[end:tables]" in report
    assert "**64.0 [64.0, 64.0] units**, 0.50 [0.50, 0.50] of `PROMPT_COST` (128)" in report
    assert "**0.75 [0.75, 0.75] units**, 0.50 [0.50, 0.50] of `POSTPROCESS_COST_PER_VALUE`" in report
    assert "**12.0 [12.0, 12.0] units**, 0.30 [0.30, 0.30] of `POSTPROCESS_COST_PER_OUTPUT`" in report
    assert "| `process` | 325 [325, 325] | 1100 [1100, 1100] | 25.0 [25.0, 25.0] |" in report


def test_the_prices_bound_the_committed_measurement() -> None:
    """`_cost.py`'s prices are at least the committed run's costs, at the upper
    end of their intervals: a prompt beyond its characters, an output value,
    an output besides its values, and every request and answer it timed
    (the run prices them with the constants of its commit, as they are now)."""
    from offload_vllm import _cost

    result = json.loads((RESULTS / "render-cost.json").read_text())
    s = result["summary"]
    assert (result["prompt_cost"], result["postprocess_cost_per_value"], result["postprocess_cost_per_output"]) == (
        _cost.PROMPT_COST, _cost.POSTPROCESS_COST_PER_VALUE, _cost.POSTPROCESS_COST_PER_OUTPUT
    ), "render-cost's results were measured with other prices: rerun `python -m benchmarks render-cost`"
    assert s["prompt"]["units_per_prompt"][2] <= _cost.PROMPT_COST
    assert s["value"]["units_per_value"][2] <= _cost.POSTPROCESS_COST_PER_VALUE
    assert s["output"]["units_per_output"][2] <= _cost.POSTPROCESS_COST_PER_OUTPUT
    assert {name: a["answer_over_its_price"][2] <= 1 for name, a in s["answers"].items()} == dict.fromkeys(s["answers"], True)
