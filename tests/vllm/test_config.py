"""Fast checks of the adapter's settings and plugin load: no server."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import offload_vllm
import pytest
from offload_vllm import (
    OffloadVLLMConfigError,
    _seamcheck,
    _seams,
    read_settings,
)
from offload_vllm.__main__ import main
from offload_vllm._config import KNOWN_ENV, LEGACY_NAMES, OPTIONS, Settings, adopt_new_names

import offload

# A few tests import vLLM in a fresh interpreter: seconds when idle, minutes on a busy machine.
pytestmark = pytest.mark.timeout(600)


def test_unset_keeps_vllm_behaviour() -> None:
    settings = read_settings({})
    assert settings.strategy is None
    assert settings.workers is None


@pytest.mark.parametrize("strategy", [s for s in offload_vllm.ADAPTER_STRATEGIES if s in offload.STRATEGIES])
def test_strategy_from_adapter_variable_first(strategy: str) -> None:
    settings = read_settings({"OFFLOAD_VLLM_STRATEGY": strategy, "OFFLOAD_STRATEGY": "inline"})
    assert (settings.strategy, settings.strategy_source) == (strategy, "OFFLOAD_VLLM_STRATEGY")


def test_falls_back_to_offload_strategy() -> None:
    settings = read_settings({"OFFLOAD_STRATEGY": "thread"})
    assert (settings.strategy, settings.strategy_source) == ("thread", "OFFLOAD_STRATEGY")


def test_workers() -> None:
    assert read_settings({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": " 3 "}).workers == 3


def test_worker_nice() -> None:
    assert read_settings({"OFFLOAD_VLLM_STRATEGY": "process"}).worker_nice is None  # the strategy's 10
    assert read_settings({"OFFLOAD_VLLM_STRATEGY": "process", "OFFLOAD_VLLM_WORKER_NICE": "0"}).worker_nice == 0
    assert read_settings({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKER_NICE": "5"}).worker_nice == 5


def test_express_cost() -> None:
    from offload_vllm._config import DEFAULT_EXPRESS_COST

    assert DEFAULT_EXPRESS_COST == 32768
    for strategy in ("thread", "process"):
        assert read_settings({"OFFLOAD_VLLM_STRATEGY": strategy}).express_cost == DEFAULT_EXPRESS_COST
        given = read_settings({"OFFLOAD_VLLM_STRATEGY": strategy, "OFFLOAD_VLLM_EXPRESS_COST": " 9000.5 "})
        assert given.express_cost == 9000.5
        assert "express_cost=9000.5" in given.summary()
        assert read_settings({"OFFLOAD_VLLM_STRATEGY": strategy, "OFFLOAD_VLLM_EXPRESS_COST": "0"}).express_cost == 0
    # The others have no express worker.
    for strategy in ("inline", "async-renderer", "ray"):
        assert Settings(strategy, None, "test").express_cost == 0
    assert read_settings({}).express_cost == 0


def test_inline_cost() -> None:
    from offload_vllm._config import DEFAULT_INLINE_COST

    for strategy in ("thread", "process"):
        assert read_settings({"OFFLOAD_VLLM_STRATEGY": strategy}).inline_cost == DEFAULT_INLINE_COST
        given = read_settings({"OFFLOAD_VLLM_STRATEGY": strategy, "OFFLOAD_VLLM_INLINE_COST": " 300.5 "})
        assert given.inline_cost == 300.5
        assert "inline_cost=300.5" in given.summary()
        assert read_settings({"OFFLOAD_VLLM_STRATEGY": strategy, "OFFLOAD_VLLM_INLINE_COST": "0"}).inline_cost == 0
    # Strategies without a pool never run a call inline on their own account.
    for strategy in ("inline", "async-renderer"):
        assert read_settings({"OFFLOAD_VLLM_STRATEGY": strategy}).inline_cost == 0
    assert read_settings({}).inline_cost == 0


@pytest.mark.skipif("ray" not in offload.STRATEGIES, reason="offload-ray is not installed here")
def test_ray_address() -> None:
    settings = read_settings({"OFFLOAD_VLLM_STRATEGY": "ray", "OFFLOAD_VLLM_RAY_ADDRESS": " ray://head:10001 "})
    assert (settings.strategy, settings.ray_address) == ("ray", "ray://head:10001")
    assert read_settings({"OFFLOAD_VLLM_STRATEGY": "ray", "OFFLOAD_VLLM_WORKERS": "3"}).workers == 3


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OFFLOAD_VLLM_STRATEGY": "threads"}, "'threads' is not a strategy the vLLM adapter supports; valid: inline, thread, process, async-renderer, ray"),
        ({"OFFLOAD_STRATEGY": "fork"}, "OFFLOAD_STRATEGY='fork'"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": "0"}, "OFFLOAD_VLLM_WORKERS must be a positive integer (1 or more), got 0"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": "two"}, "is not an integer"),
        ({"OFFLOAD_VLLM_STRATEGY": "inline", "OFFLOAD_VLLM_WORKERS": "2"}, "has no effect with strategy 'inline'"),
        ({"OFFLOAD_VLLM_STRATEGY": "async-renderer", "OFFLOAD_VLLM_WORKERS": "2"}, "has no effect with strategy 'async-renderer'"),
        ({"OFFLOAD_VLLM_WORKERS": "2"}, "has no effect with no strategy set"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WOKRERS": "2"}, "unknown setting(s) OFFLOAD_VLLM_WOKRERS"),
        ({"OFFLOAD_VLLM_STRATEGY": "process", "OFFLOAD_VLLM_RAY_ADDRESS": "auto"}, "has no effect with strategy 'process'; unset it, or set OFFLOAD_VLLM_STRATEGY=ray"),
        ({"OFFLOAD_VLLM_RAY_ADDRESS": "auto"}, "OFFLOAD_VLLM_RAY_ADDRESS='auto' has no effect with no strategy set"),
        ({"OFFLOAD_VLLM_STRATEGY": "process", "OFFLOAD_VLLM_WORKER_NICE": "20"}, "is not a niceness increment"),
        ({"OFFLOAD_VLLM_STRATEGY": "async-renderer", "OFFLOAD_VLLM_BATCH_WAIT": "-0.1"}, "is not a wait"),
        ({"OFFLOAD_VLLM_STRATEGY": "async-renderer", "OFFLOAD_VLLM_BATCH_WAIT": "nan"}, "is not a wait"),
        ({"OFFLOAD_VLLM_STRATEGY": "async-renderer", "OFFLOAD_VLLM_BATCH_WAIT": "2ms"}, "is not a wait"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_BATCH_WAIT": "0.002"}, "has no effect with strategy 'thread'"),
        ({"OFFLOAD_VLLM_STRATEGY": "process", "OFFLOAD_VLLM_WORKER_NICE": "-5"}, "is not a niceness increment"),
        ({"OFFLOAD_VLLM_STRATEGY": "async-renderer", "OFFLOAD_VLLM_WORKER_NICE": "5"}, "has no effect with strategy 'async-renderer'"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_INLINE_COST": "-1"}, "is not a cost"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_INLINE_COST": "inf"}, "is not a cost"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_INLINE_COST": "nan"}, "is not a cost"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_INLINE_COST": "1k"}, "is not a cost"),
        ({"OFFLOAD_VLLM_STRATEGY": "async-renderer", "OFFLOAD_VLLM_INLINE_COST": "256"}, "has no effect with strategy 'async-renderer'"),
        ({"OFFLOAD_VLLM_STRATEGY": "inline", "OFFLOAD_VLLM_INLINE_COST": "256"}, "has no effect with strategy 'inline'"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_EXPRESS_COST": "-1"}, "is not a cost"),
        ({"OFFLOAD_VLLM_STRATEGY": "process", "OFFLOAD_VLLM_EXPRESS_COST": "inf"}, "is not a cost"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_EXPRESS_COST": "nan"}, "is not a cost"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_EXPRESS_COST": "16k"}, "is not a cost"),
        ({"OFFLOAD_VLLM_STRATEGY": "inline", "OFFLOAD_VLLM_EXPRESS_COST": "256"}, "has no effect with strategy 'inline'"),
        ({"OFFLOAD_VLLM_STRATEGY": "async-renderer", "OFFLOAD_VLLM_EXPRESS_COST": "256"}, "it has no express worker"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_HEALTH_PORT": "0"}, "OFFLOAD_VLLM_HEALTH_PORT='0' is not a port"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_HEALTH_PORT": "65536"}, "is not a port"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_HEALTH_PORT": "http"}, "is not a port"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_HEALTH_PORT": "-1"}, "is not a port"),
        ({"OFFLOAD_VLLM_HEALTH_MAX_STALL": "3"}, "OFFLOAD_VLLM_HEALTH_MAX_STALL has no effect without OFFLOAD_VLLM_HEALTH_PORT"),
        ({"OFFLOAD_VLLM_HEALTH_PORT": "8081", "OFFLOAD_VLLM_VALIDATION_SHORTCUT": "0"}, "OFFLOAD_VLLM_VALIDATION_SHORTCUT='0' has no effect with no strategy set"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_HEALTH_PORT": "8081", "OFFLOAD_VLLM_HEALTH_MAX_STALL": "0"}, "OFFLOAD_VLLM_HEALTH_MAX_STALL='0'"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_HEALTH_MAX_STALL": "3"}, "OFFLOAD_VLLM_HEALTH_MAX_STALL has no effect without OFFLOAD_VLLM_HEALTH_PORT"),
    ],
)
def test_bad_values_name_themselves(env: dict[str, str], message: str) -> None:
    with pytest.raises(OffloadVLLMConfigError) as info:
        read_settings(env)
    assert message in str(info.value)
    assert isinstance(info.value, offload.ConfigError)


# ---- the settings' old names (VLLM_OFFLOAD_*) --------------------------------

#: A valid value for each setting, with the strategy it needs.
VALID = {
    "OFFLOAD_VLLM_STRATEGY": ("thread", {}),
    "OFFLOAD_VLLM_WORKERS": ("3", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_MAX_QUEUE": ("7", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_MAX_QUEUED_COST": ("5000", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_SCHEDULING": ("fifo", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_LANES": ("query=4,ingest=1", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_LANE_ROUTES": ("/score=default", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_LANE_HEADER": ("off", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_MAX_REQUEST_COST": ("100000", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_ENGINE_PRIORITY": ("1", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_RAY_ADDRESS": ("ray://head:10001", {"OFFLOAD_VLLM_STRATEGY": "ray"}),
    "OFFLOAD_VLLM_WORKER_NICE": ("0", {"OFFLOAD_VLLM_STRATEGY": "process"}),
    "OFFLOAD_VLLM_INLINE_COST": ("256", {"OFFLOAD_VLLM_STRATEGY": "process"}),
    "OFFLOAD_VLLM_EXPRESS_COST": ("16384", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_VALIDATION_SHORTCUT": ("0", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_HEALTH_PORT": ("8081", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_HEALTH_MAX_STALL": ("2.5", {"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_HEALTH_PORT": "8081"}),
    "OFFLOAD_VLLM_PREFIX_TOKENIZE": ("0", {"OFFLOAD_VLLM_STRATEGY": "thread"}),
    "OFFLOAD_VLLM_BATCH_ACROSS_REQUESTS": ("0", {"OFFLOAD_VLLM_STRATEGY": "async-renderer"}),
    "OFFLOAD_VLLM_BATCH_WAIT": ("0.002", {"OFFLOAD_VLLM_STRATEGY": "async-renderer"}),
}
#: The settings that had a first name (VLLM_OFFLOAD_*); later ones never did.
RENAMED = ("OFFLOAD_VLLM_STRATEGY", "OFFLOAD_VLLM_WORKERS", "OFFLOAD_VLLM_MAX_QUEUE", "OFFLOAD_VLLM_RAY_ADDRESS")


def _valid(name: str) -> tuple[str, dict[str, str]]:
    value, needs = VALID[name]
    if needs.get("OFFLOAD_VLLM_STRATEGY", value) not in offload.STRATEGIES:
        pytest.skip("offload-ray is not installed here")
    return value, needs


def test_every_setting_has_a_case_and_the_first_ones_an_old_name() -> None:
    assert set(VALID) == set(KNOWN_ENV)
    assert tuple(LEGACY_NAMES) == RENAMED
    assert [LEGACY_NAMES[n] for n in RENAMED] == [
        "VLLM_OFFLOAD_STRATEGY", "VLLM_OFFLOAD_WORKERS", "VLLM_OFFLOAD_MAX_QUEUE", "VLLM_OFFLOAD_RAY_ADDRESS",
    ]


@pytest.mark.parametrize("name", KNOWN_ENV)
def test_new_names_need_no_warning(name: str) -> None:
    value, needs = _valid(name)
    settings = read_settings({**needs, name: value})
    assert (settings.legacy_names, settings.legacy_warning()) == ((), None)


@pytest.mark.parametrize("name", RENAMED)
def test_old_name_still_works_with_a_warning_naming_the_new_one(name: str) -> None:
    value, needs = _valid(name)
    new = read_settings({**needs, name: value})
    old = read_settings({**needs, LEGACY_NAMES[name]: value})
    assert (old.strategy, old.workers, old.max_queue, old.ray_address) == (
        new.strategy, new.workers, new.max_queue, new.ray_address,
    )
    assert old.legacy_names == (name,)
    warning = old.legacy_warning()
    assert warning is not None
    assert f"rename {LEGACY_NAMES[name]} -> {name}:" in warning


def test_warning_names_every_old_name_set_once() -> None:
    settings = read_settings({"VLLM_OFFLOAD_STRATEGY": "thread", "VLLM_OFFLOAD_WORKERS": "2"})
    assert settings.legacy_names == ("OFFLOAD_VLLM_STRATEGY", "OFFLOAD_VLLM_WORKERS")
    assert (settings.legacy_warning() or "").startswith(
        "offload-vllm: rename VLLM_OFFLOAD_STRATEGY -> OFFLOAD_VLLM_STRATEGY, "
        "VLLM_OFFLOAD_WORKERS -> OFFLOAD_VLLM_WORKERS: "
    )


def test_strategy_precedence_new_then_old_then_offload_strategy() -> None:
    env = {"OFFLOAD_STRATEGY": "inline"}
    assert read_settings(env).strategy_source == "OFFLOAD_STRATEGY"
    env["VLLM_OFFLOAD_STRATEGY"] = "process"
    assert (read_settings(env).strategy, read_settings(env).strategy_source) == ("process", "VLLM_OFFLOAD_STRATEGY")
    env["OFFLOAD_VLLM_STRATEGY"] = "process"
    assert (read_settings(env).strategy, read_settings(env).strategy_source) == ("process", "OFFLOAD_VLLM_STRATEGY")


@pytest.mark.parametrize("name", RENAMED)
def test_both_names_with_the_same_value_are_accepted(name: str) -> None:
    value, needs = _valid(name)
    settings = read_settings({**needs, name: value, LEGACY_NAMES[name]: f" {value} "})
    assert settings == read_settings({**needs, name: value, LEGACY_NAMES[name]: value})
    assert settings.legacy_names == (name,)


@pytest.mark.parametrize("name", RENAMED)
def test_both_names_with_different_values_are_refused(name: str) -> None:
    value, needs = _valid(name)
    other = {"OFFLOAD_VLLM_STRATEGY": "process"}.get(name, "5")
    with pytest.raises(OffloadVLLMConfigError) as info:
        read_settings({**needs, name: value, LEGACY_NAMES[name]: other})
    assert str(info.value) == (
        f"{name}={value!r} and {LEGACY_NAMES[name]}={other!r} (its old name) disagree; "
        f"unset {LEGACY_NAMES[name]}, and set {name} alone"
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKER": "2"}, "unknown setting(s) OFFLOAD_VLLM_WORKER;"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "VLLM_OFFLOAD_WORKER": "2"}, "unknown setting(s) VLLM_OFFLOAD_WORKER;"),
        # Refused even with nothing else set: a typo of the one setting meant.
        ({"OFFLOAD_VLLM_STRATGY": "thread"}, "unknown setting(s) OFFLOAD_VLLM_STRATGY;"),
        ({"OFFLOAD_VLLM_": "x", "OFFLOAD_VLLM_strategy": "thread"}, "unknown setting(s) OFFLOAD_VLLM_, OFFLOAD_VLLM_strategy;"),
        # An old name's bad value is named as it was given.
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "VLLM_OFFLOAD_WORKERS": "two"}, "VLLM_OFFLOAD_WORKERS='two' is not an integer"),
        ({"VLLM_OFFLOAD_MAX_QUEUE": "4"}, "VLLM_OFFLOAD_MAX_QUEUE=4 has no effect with no strategy set; unset it, or set OFFLOAD_VLLM_STRATEGY="),
    ],
)
def test_unknown_names_and_old_names_bad_values(env: dict[str, str], message: str) -> None:
    with pytest.raises(OffloadVLLMConfigError) as info:
        read_settings(env)
    assert message in str(info.value)


def _docs_rows() -> dict[str, list[str]]:
    """docs/vllm.md's settings rows by variable: the cells of each table row
    whose first cell names an `OFFLOAD_VLLM_*` variable (`\\|` is a `|` in a cell)."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "vllm.md").read_text()
    rows = {}
    for line in docs.splitlines():
        if line.startswith("| `OFFLOAD_VLLM_"):
            cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows[cells[0].split("`")[1]] = cells
    return rows


def test_docs_settings_tables_match_the_table() -> None:
    """docs/vllm.md has one row per setting of `OPTIONS`, and no other: its
    variable and flag, its values and default as the table gives them, and
    its effect says where it is refused, as the table decides."""
    rows = _docs_rows()
    assert list(rows) == [option.env for option in OPTIONS]
    for option in OPTIONS:
        variable, values, default, effect = rows[option.env]
        assert variable == f"`{option.env}` (`{option.flag}`)"
        assert (values, default) == (option.values, option.default), option.env
        assert option.refusal() in effect, option.env


def test_serve_help_lists_every_setting_from_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    """`--help` names each row's flag, value, variable, one-line doc and refusal; no other flag."""
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for option in OPTIONS:
        assert f"\n  {option.usage()[1:-1]}\n      {option.env}. {option.doc} Default: " in out
        assert option.refusal().replace("`", "") in out
    assert set(re.findall(r"^  (--offload-[a-z-]+)", out, re.MULTILINE)) == {option.flag for option in OPTIONS}


def test_settings_fields_are_the_table_rows() -> None:
    """Every `Settings` field but where it was read from is one row's."""
    assert {option.attribute for option in OPTIONS} == {
        f.name for f in dataclasses.fields(Settings) if f.name not in ("strategy_source", "legacy_names")
    }


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(OffloadVLLMConfigError) as info:
        read_settings({"OFFLOAD_VLLM_WOKRERS": "2"})
    assert str(info.value) == (
        "unknown setting(s) OFFLOAD_VLLM_WOKRERS; the offload vLLM adapter reads OFFLOAD_VLLM_STRATEGY, "
        "OFFLOAD_VLLM_WORKERS, OFFLOAD_VLLM_MAX_QUEUE, OFFLOAD_VLLM_MAX_QUEUED_COST, OFFLOAD_VLLM_SCHEDULING, "
        "OFFLOAD_VLLM_LANES, OFFLOAD_VLLM_LANE_ROUTES, OFFLOAD_VLLM_LANE_HEADER, OFFLOAD_VLLM_MAX_REQUEST_COST, "
        "OFFLOAD_VLLM_ENGINE_PRIORITY, OFFLOAD_VLLM_RAY_ADDRESS, "
        "OFFLOAD_VLLM_WORKER_NICE, OFFLOAD_VLLM_INLINE_COST, OFFLOAD_VLLM_EXPRESS_COST, OFFLOAD_VLLM_VALIDATION_SHORTCUT, OFFLOAD_VLLM_HEALTH_PORT, OFFLOAD_VLLM_HEALTH_MAX_STALL, OFFLOAD_VLLM_PREFIX_TOKENIZE, OFFLOAD_VLLM_BATCH_ACROSS_REQUESTS, OFFLOAD_VLLM_BATCH_WAIT (and the old names VLLM_OFFLOAD_STRATEGY, VLLM_OFFLOAD_WORKERS, VLLM_OFFLOAD_MAX_QUEUE, "
        "VLLM_OFFLOAD_RAY_ADDRESS)"
    )


@pytest.fixture
def launcher_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A clean slate for the launcher's settings, restored after the test, and
    vLLM's `vllm serve` replaced by a recorder of the settings it would get."""
    for name in (*KNOWN_ENV, *LEGACY_NAMES.values(), "OFFLOAD_STRATEGY"):
        # set first, so that the environment main() writes is undone after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    seen: dict[str, str] = {}

    def run_serve(*args: object, **kwargs: object) -> None:
        seen.update({k: os.environ[k] for k in (*KNOWN_ENV, *LEGACY_NAMES.values()) if k in os.environ})

    monkeypatch.setattr("offload_vllm._seams.serve_command.run_serve", run_serve)
    return seen


def test_launcher_flags_set_the_new_names(launcher_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "m", "--offload-strategy", "thread", "--offload-workers", "2", "--offload-max-queue", "3"]) == 0
    assert launcher_env == {
        "OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": "2", "OFFLOAD_VLLM_MAX_QUEUE": "3",
    }
    assert "rename" not in capsys.readouterr().err


def test_launcher_moves_old_names_to_new_ones_with_one_warning(
    launcher_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM, which warns about every VLLM_* variable it does not know, never sees the old names."""
    monkeypatch.setenv("VLLM_OFFLOAD_WORKERS", "2")
    monkeypatch.setenv("VLLM_OFFLOAD_STRATEGY", "process")
    # The flag wins over the environment, under either name, as it did before.
    assert main(["serve", "m", "--offload-strategy", "thread"]) == 0
    assert launcher_env == {"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": "2"}
    err = capsys.readouterr().err
    assert err.count("rename") == 1
    assert "offload-vllm: rename VLLM_OFFLOAD_WORKERS -> OFFLOAD_VLLM_WORKERS:" in err


def test_launcher_refuses_names_that_disagree(
    launcher_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VLLM_OFFLOAD_WORKERS", "2")
    monkeypatch.setenv("OFFLOAD_VLLM_WORKERS", "4")
    assert main(["serve", "m", "--offload-strategy", "thread"]) == 2
    assert "OFFLOAD_VLLM_WORKERS='4' and VLLM_OFFLOAD_WORKERS='2' (its old name) disagree" in capsys.readouterr().err
    assert launcher_env == {}


@pytest.mark.parametrize("strategy", offload_vllm.ADAPTER_STRATEGIES)
def test_strategy_missing_from_offload_is_refused(strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older `offload` without one of the adapter's strategies is refused by name."""
    monkeypatch.setattr(offload, "STRATEGIES", tuple(s for s in offload.STRATEGIES if s != strategy))
    with pytest.raises(OffloadVLLMConfigError, match="does not provide this strategy"):
        read_settings({"OFFLOAD_VLLM_STRATEGY": strategy})


def test_installed_vllm_has_every_seam() -> None:
    assert _seamcheck.check_seams() == []
    assert _seams.vllm_version() in _seams.TESTED_VLLM_VERSIONS


def test_missing_seam_fails_naming_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        _seams, "REQUIRED", (*_seams.REQUIRED, _seams.Seam("vllm.renderers.base", "BaseRenderer", "no_such_seam"))
    )
    monkeypatch.setattr(_seams, "vllm_version", lambda: "9.9.9")
    with pytest.raises(offload_vllm.UnsupportedVLLMVersion) as info:
        _seamcheck.require_supported_vllm()
    text = str(info.value)
    assert "vLLM 9.9.9" in text
    assert "vllm.renderers.base.BaseRenderer.no_such_seam" in text
    assert "0.32.0" in text


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_OFFLOAD_", "OFFLOAD_"))}
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, check=False, capture_output=True, text=True, timeout=300
    )


#: Settings, and the hooks the plugin then runs where vLLM builds its app, in order.
APP_HOOKS: list[tuple[dict[str, str], str]] = [
    # The door is there with no offload bound: vLLM's --max-num-queued-reqs is one.
    ({}, "hold_until_answered,refuse_when_full,shortcut_validation,time_phases"),
    ({"OFFLOAD_VLLM_VALIDATION_SHORTCUT": "0"}, "hold_until_answered,refuse_when_full,time_phases"),
    (
        {"OFFLOAD_VLLM_STRATEGY": "async-renderer", "OFFLOAD_VLLM_MAX_QUEUE": "4"},
        "count_requests,hold_until_answered,refuse_when_full,shortcut_validation,time_phases",
    ),
]
_LOAD = "from vllm.plugins import load_general_plugins; load_general_plugins()\n"
#: What vLLM does at start, each in a fresh interpreter: (code, environment).
PLUGIN_LOADS: dict[str, tuple[str, dict[str, str]]] = {
    "bad value": (_LOAD, {"OFFLOAD_VLLM_STRATEGY": "bogus"}),
    "seams": (
        _LOAD
        + "from vllm.entrypoints.pooling.base.io_processor import PoolingIOProcessor\n"
        "import offload_vllm\n"
        "print(offload_vllm.active_strategy(), PoolingIOProcessor.__init__.__offload_vllm__)",
        {"OFFLOAD_VLLM_STRATEGY": "thread"},
    ),
    **{
        f"app hooks {hooks}": (
            _LOAD
            + "from vllm.entrypoints.launchers import app\n"
            "print(','.join(app.init_entrypoints_middleware.__offload_vllm_app__))\n"
            "print(app.init_entrypoints_middleware.__wrapped__.__module__.split('.')[0])",
            {"OFFLOAD_VLLM_STRATEGY": "thread", **env},
        )
        for env, hooks in APP_HOOKS
    },
    # No strategy: the health port alone is wired (its binding, and the engine
    # client seen as the app state is built); nothing that changes a request is.
    "health port alone": (
        _LOAD
        + "from vllm.entrypoints.launchers import app\n"
        "from vllm.entrypoints.openai.models.serving import OpenAIServingModels\n"
        "from vllm.entrypoints.pooling.base.io_processor import PoolingIOProcessor\n"
        "from vllm.entrypoints.pooling.base.serving import PoolingBaseServing\n"
        "import offload_vllm\n"
        "print(offload_vllm.active_strategy(), ','.join(app.init_entrypoints_middleware.__offload_vllm_app__),\n"
        "      getattr(OpenAIServingModels.__init__, '__offload_vllm__', False),\n"
        "      getattr(PoolingBaseServing.__init__, '__offload_vllm__', False),\n"
        "      getattr(PoolingIOProcessor.__init__, '__offload_vllm__', False))",
        {"OFFLOAD_VLLM_HEALTH_PORT": "8081"},
    ),
    "nothing set": (
        _LOAD
        + "from vllm.entrypoints.launchers import app\n"
        "from vllm.entrypoints.pooling.base.serving import PoolingBaseServing\n"
        "import offload_vllm\n"
        "print(offload_vllm.active_strategy(), hasattr(app.init_entrypoints_middleware, '__offload_vllm_app__'),\n"
        "      getattr(PoolingBaseServing.__init__, '__offload_vllm__', False))",
        {},
    ),
    "old name": (
        _LOAD
        + "import os, offload_vllm\n"
        "offload_vllm.register()\n"
        "print(offload_vllm.active_strategy(), os.environ.get('OFFLOAD_VLLM_STRATEGY'), "
        "os.environ.get('VLLM_OFFLOAD_STRATEGY'))",
        {"VLLM_OFFLOAD_STRATEGY": "thread"},
    ),
}


@pytest.fixture(scope="module")
def plugin_loads() -> dict[str, subprocess.CompletedProcess[str]]:
    """Every `PLUGIN_LOADS` interpreter, all started at once on first use:
    each spends tens of seconds importing vLLM, and one after another they
    were a third of this machine's vLLM-free tests."""
    with concurrent.futures.ThreadPoolExecutor(len(PLUGIN_LOADS)) as pool:
        futures = {key: pool.submit(_python, code, **env) for key, (code, env) in PLUGIN_LOADS.items()}
    return {key: future.result() for key, future in futures.items()}


def test_vllm_plugin_load_stops_on_bad_value(plugin_loads: dict[str, subprocess.CompletedProcess[str]]) -> None:
    """What vLLM does at start (`load_general_plugins`) raises: the server never comes up."""
    proc = plugin_loads["bad value"]
    assert proc.returncode != 0
    assert "OffloadVLLMConfigError" in proc.stderr
    assert "OFFLOAD_VLLM_STRATEGY='bogus'" in proc.stderr


def test_vllm_plugin_load_patches_seams(plugin_loads: dict[str, subprocess.CompletedProcess[str]]) -> None:
    proc = plugin_loads["seams"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-2:] == ["thread", "True"]


@pytest.mark.parametrize("hooks", [hooks for _, hooks in APP_HOOKS])
def test_vllm_plugin_load_patches_where_vllm_builds_its_app_once_in_order(
    hooks: str, plugin_loads: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    """A fresh process, as vLLM starts one: `init_entrypoints_middleware` is
    replaced once (`_seams/app.py`), and runs the door's middlewares and the
    validation shortcut (`_seams/validation.py`) in the order `register` gives."""
    proc = plugin_loads[f"app hooks {hooks}"]
    assert proc.returncode == 0, proc.stderr
    # What it wraps is vLLM's own, not another wrapper of the adapter's.
    assert proc.stdout.split()[-2:] == [hooks, "vllm"]


def test_vllm_plugin_load_with_the_health_port_alone_patches_only_its_seams(
    plugin_loads: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    """No strategy, the health port set: the port's binding where vLLM builds
    its app, and the engine client's first holder (to start the loop's task),
    and nothing else (no pooling serving object or IO processor changed);
    with neither set, nothing at all."""
    proc = plugin_loads["health port alone"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-5:] == ["None", "bind_health", "True", "False", "False"]
    proc = plugin_loads["nothing set"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-3:] == ["None", "False", "False"]


def test_vllm_plugin_load_warns_once_about_an_old_name(
    plugin_loads: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    """Once: registering again (as vLLM does in the processes it starts, which
    inherit the environment) finds the new name only."""
    proc = plugin_loads["old name"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-3:] == ["thread", "thread", "None"]
    assert proc.stderr.count("offload-vllm: rename VLLM_OFFLOAD_STRATEGY -> OFFLOAD_VLLM_STRATEGY:") == 1


def test_adopt_new_names_moves_only_what_was_read_under_an_old_name() -> None:
    env = {"VLLM_OFFLOAD_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": "2", "VLLM_OFFLOAD_WORKERS": "2"}
    settings = read_settings(env)
    adopt_new_names(settings, env)
    assert env == {"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_WORKERS": "2"}
    assert read_settings(env) == settings
    assert read_settings(env).legacy_names == ()


def test_launcher_refuses_bad_value_before_starting_vllm() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "offload_vllm", "serve", "some-model", "--offload-strategy", "nope"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "offload-vllm: OFFLOAD_VLLM_STRATEGY='nope' is not a strategy" in proc.stderr


def test_launcher_refuses_a_lane_weight_the_executor_refuses_before_starting_vllm() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "offload_vllm", "serve", "some-model", "--offload-strategy", "thread",
         "--offload-lanes", "tiny=1e-10"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "offload-vllm: OFFLOAD_VLLM_LANES='tiny=1e-10': lane 'tiny': the weight must be" in proc.stderr


def test_launcher_usage() -> None:
    proc = subprocess.run([sys.executable, "-m", "offload_vllm"], check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "python -m offload_vllm serve MODEL" in proc.stderr


# ---- costs, lanes, scheduling, engine priority -------------------------------------

THREAD = {"OFFLOAD_VLLM_STRATEGY": "thread"}


def test_lanes_routes_scheduling_cost_bound_and_engine_priority_are_read() -> None:
    settings = read_settings(
        {
            **THREAD,
            "OFFLOAD_VLLM_LANES": " query = 4 , ingest=0.5",
            "OFFLOAD_VLLM_LANE_ROUTES": "/v1/embeddings=query, /score=ingest,/rerank=default",
            "OFFLOAD_VLLM_SCHEDULING": "fifo",
            "OFFLOAD_VLLM_MAX_QUEUED_COST": "250000",
            "OFFLOAD_VLLM_ENGINE_PRIORITY": "on",
        }
    )
    assert settings.lanes == (("query", 4.0), ("ingest", 0.5))
    assert settings.lane_routes == (("/v1/embeddings", "query"), ("/score", "ingest"), ("/rerank", "default"))
    assert (settings.scheduling, settings.max_queued_cost, settings.engine_priority) == ("fifo", 250000.0, True)
    router = settings.lane_router()
    assert router.lanes == {"default", "query", "ingest"}
    assert router.lane_for("/score", None) == "ingest"
    defaults = read_settings(THREAD)
    assert (defaults.scheduling, defaults.lanes, defaults.max_queued_cost, defaults.engine_priority) == (
        "fair", (), None, False,
    )
    assert read_settings({**THREAD, "OFFLOAD_VLLM_ENGINE_PRIORITY": "0"}).engine_priority is False
    # Engine priority needs no queue: any strategy.
    assert read_settings({"OFFLOAD_VLLM_STRATEGY": "inline", "OFFLOAD_VLLM_ENGINE_PRIORITY": "1"}).engine_priority


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OFFLOAD_VLLM_SCHEDULING": "lifo"}, "OFFLOAD_VLLM_SCHEDULING='lifo' is not a scheduling; valid: fair, fifo"),
        ({"OFFLOAD_VLLM_MAX_QUEUED_COST": "lots"}, "OFFLOAD_VLLM_MAX_QUEUED_COST='lots' is not a number"),
        ({"OFFLOAD_VLLM_MAX_QUEUED_COST": "0"}, "must be a finite number > 0"),
        ({"OFFLOAD_VLLM_MAX_QUEUED_COST": "inf"}, "must be a finite number > 0"),
        ({"OFFLOAD_VLLM_LANES": "query"}, "OFFLOAD_VLLM_LANES='query': 'query' is not LANE=WEIGHT"),
        ({"OFFLOAD_VLLM_LANES": "query=fast"}, "the weight of lane 'query' (> 0)"),
        ({"OFFLOAD_VLLM_LANES": "query=-1"}, "the weight of lane 'query' must be a finite number > 0"),
        ({"OFFLOAD_VLLM_LANES": "query=1,query=2"}, "query is given twice"),
        ({"OFFLOAD_VLLM_LANE_ROUTES": "/v1/models=default"}, "/v1/models is not a pooling or generate route"),
        ({"OFFLOAD_VLLM_LANE_ROUTES": "/score=bulk"}, "route /score names lane 'bulk', which is not a lane"),
        (
            {"OFFLOAD_VLLM_LANES": "query=4", "OFFLOAD_VLLM_LANE_ROUTES": "/score=ingest"},
            "the lanes are default, query (add lanes with OFFLOAD_VLLM_LANES)",
        ),
        ({"OFFLOAD_VLLM_ENGINE_PRIORITY": "maybe"}, "OFFLOAD_VLLM_ENGINE_PRIORITY='maybe' is not a switch"),
        # A subnormal weight passed, then every request of its lane failed (OverflowError) with engine priority.
        (
            {"OFFLOAD_VLLM_LANES": "tiny=1e-320"},
            "OFFLOAD_VLLM_LANES='tiny=1e-320': lane 'tiny': the weight must be a number from 1e-09 to 1e+09",
        ),
        ({"OFFLOAD_VLLM_LANES": "query=4,tiny=5e-324"}, "lane 'tiny': the weight must be a number from 1e-09"),
        # Weights the executor refuses are refused here, at start, naming the setting (the
        # server used to load the model and then exit with the executor's error).
        ({"OFFLOAD_VLLM_LANES": "tiny=1e-10"}, "OFFLOAD_VLLM_LANES='tiny=1e-10': lane 'tiny': the weight must be"),
        ({"OFFLOAD_VLLM_LANES": "huge=2e9"}, "OFFLOAD_VLLM_LANES='huge=2e9': lane 'huge': the weight must be"),
        # A lane a header (read as latin-1) could never name.
        (
            {"OFFLOAD_VLLM_LANES": "requête=2"},
            "OFFLOAD_VLLM_LANES='requête=2': 'requête' is not a lane name; a lane name is made of ASCII letters, digits and",
        ),
        ({"OFFLOAD_VLLM_LANES": "a b=2"}, "'a b' is not a lane name"),
        ({"OFFLOAD_VLLM_LANES": "q:1=2"}, "'q:1' is not a lane name"),
        ({"OFFLOAD_VLLM_LANE_HEADER": "query"}, "OFFLOAD_VLLM_LANE_HEADER: 'query' is not a lane; the lanes are default"),
        ({"OFFLOAD_VLLM_LANE_HEADER": "default,,x"}, "OFFLOAD_VLLM_LANE_HEADER='default,,x': give on, off or a list of lanes"),
        ({"OFFLOAD_VLLM_LANE_HEADER": "default,default"}, "default is given twice"),
        ({"OFFLOAD_VLLM_LANE_HEADER": "défaut"}, "OFFLOAD_VLLM_LANE_HEADER='défaut': 'défaut' is not a lane name"),
        ({"OFFLOAD_VLLM_MAX_REQUEST_COST": "big"}, "OFFLOAD_VLLM_MAX_REQUEST_COST='big' is not a number"),
        ({"OFFLOAD_VLLM_MAX_REQUEST_COST": "-3"}, "OFFLOAD_VLLM_MAX_REQUEST_COST='-3': the cost one request may have"),
    ],
)
def test_bad_lane_and_cost_settings_name_themselves(env: dict[str, str], message: str) -> None:
    with pytest.raises(OffloadVLLMConfigError) as info:
        read_settings({**THREAD, **env})
    assert message in str(info.value)


def test_lane_header_and_request_cost_cap_are_read() -> None:
    lanes = {**THREAD, "OFFLOAD_VLLM_LANES": "query=4,ingest=1"}
    assert read_settings(lanes).lane_router().header_lanes is None  # default: on, every lane
    assert read_settings({**lanes, "OFFLOAD_VLLM_LANE_HEADER": "on"}).lane_header is None
    assert read_settings({**lanes, "OFFLOAD_VLLM_LANE_HEADER": "off"}).lane_router().header_lanes == frozenset()
    some = read_settings({**lanes, "OFFLOAD_VLLM_LANE_HEADER": " query , default"})
    assert some.lane_header == ("query", "default")
    assert "lane_header=query,default" in some.summary()
    capped = read_settings({**THREAD, "OFFLOAD_VLLM_MAX_REQUEST_COST": "5e4"})
    assert capped.max_request_cost == 50000.0
    assert "max_request_cost=50000" in capped.summary()
    # The cap needs no queue: any strategy, but a strategy.
    assert read_settings({"OFFLOAD_VLLM_STRATEGY": "inline", "OFFLOAD_VLLM_MAX_REQUEST_COST": "9"}).max_request_cost == 9
    with pytest.raises(OffloadVLLMConfigError, match="has no effect with no strategy set"):
        read_settings({"OFFLOAD_VLLM_MAX_REQUEST_COST": "9"})
    # Token characters are lane names.
    assert read_settings({**THREAD, "OFFLOAD_VLLM_LANES": "a.b-c_d~1=2"}).lanes == (("a.b-c_d~1", 2.0),)


@pytest.mark.parametrize(
    "name",
    [
        "OFFLOAD_VLLM_SCHEDULING", "OFFLOAD_VLLM_MAX_QUEUED_COST", "OFFLOAD_VLLM_LANES", "OFFLOAD_VLLM_LANE_ROUTES",
        "OFFLOAD_VLLM_LANE_HEADER",
    ],
)
def test_queue_settings_are_refused_where_there_is_no_queue(name: str) -> None:
    value, _ = VALID[name]
    with pytest.raises(OffloadVLLMConfigError) as info:
        read_settings({"OFFLOAD_VLLM_STRATEGY": "inline", name: value})
    assert "has no effect with strategy 'inline' (it has no queue); unset it, or set OFFLOAD_VLLM_STRATEGY=" in str(
        info.value
    )
    with pytest.raises(OffloadVLLMConfigError, match="has no effect with no strategy set"):
        read_settings({name: value})


def test_launcher_flags_for_every_setting(launcher_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "serve", "m", "--offload-strategy", "thread", "--offload-max-queued-cost", "9000",
        "--offload-scheduling", "fifo", "--offload-lanes", "query=4,ingest=1",
        "--offload-lane-routes", "/score=ingest", "--offload-engine-priority", "--scheduling-policy", "priority",
    ]
    assert main(args) == 0
    assert launcher_env == {
        "OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_MAX_QUEUED_COST": "9000", "OFFLOAD_VLLM_SCHEDULING": "fifo",
        "OFFLOAD_VLLM_LANES": "query=4,ingest=1", "OFFLOAD_VLLM_LANE_ROUTES": "/score=ingest",
        "OFFLOAD_VLLM_ENGINE_PRIORITY": "1",
    }
    # What the API server's start-up summary will say; the launcher prints none.
    summary = read_settings(launcher_env).summary()
    assert "scheduling=fifo lanes=query=4,ingest=1 lane_routes=/score=ingest engine_priority=on" in summary
    assert "scheduling=" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        # Worker counts offload itself refuses in OFFLOAD_MAX_WORKERS (`int()` takes them all).
        (["--offload-workers", "+4"], "OFFLOAD_VLLM_WORKERS='+4' is not an integer"),
        (["--offload-workers", "1_0"], "OFFLOAD_VLLM_WORKERS='1_0' is not an integer"),
        (["--offload-workers", "\u0664"], "OFFLOAD_VLLM_WORKERS='\u0664' is not an integer"),
        (["--offload-workers", "0"], "OFFLOAD_VLLM_WORKERS must be a positive integer (1 or more), got 0"),
        (["--offload-max-queue", "+4"], "OFFLOAD_VLLM_MAX_QUEUE='+4' is not an integer"),
        # Lane weights `float()` takes and the executor's check never sees as numbers.
        (["--offload-lanes", "bulk=1_0"], "OFFLOAD_VLLM_LANES='1_0' is not a number; give the weight of lane 'bulk'"),
        (["--offload-lanes", "bulk=\u0664"], "OFFLOAD_VLLM_LANES='\u0664' is not a number; give the weight of lane 'bulk'"),
        (["--offload-lanes", "bulk=1e-10"], "OFFLOAD_VLLM_LANES='bulk=1e-10': lane 'bulk': the weight must be"),
        (["--offload-max-queued-cost", "1_000"], "OFFLOAD_VLLM_MAX_QUEUED_COST='1_000' is not a number"),
    ],
)
def test_launcher_refuses_what_the_core_refuses_with_status_2_naming_the_setting(
    launcher_env: dict[str, str], capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    """Refused before vLLM is started (the recorder saw nothing), as offload's own checks refuse them."""
    assert main(["serve", "m", "--offload-strategy", "thread", *flags]) == 2
    assert f"offload-vllm: {message}" in capsys.readouterr().err
    assert launcher_env == {}


def test_launcher_refuses_an_unknown_offload_flag(launcher_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    # Not an abbreviation of --offload-lanes or --offload-lane-routes, and not passed to vLLM.
    assert main(["serve", "m", "--offload-strategy", "thread", "--offload-lane", "x"]) == 2
    assert "offload-vllm: unknown flag(s) --offload-lane" in capsys.readouterr().err
    assert launcher_env == {}


def test_usage_names_every_flag() -> None:
    """The usage line a benchmark reads (`benchmarks/suites/mixed.py`) names every `--offload-*` flag."""
    from offload_vllm.__main__ import USAGE
    from offload_vllm._config import OPTIONS

    for option in OPTIONS:
        assert option.usage() in USAGE
    for flag in ("--offload-scheduling", "--offload-max-queued-cost", "--offload-lanes", "--offload-engine-priority"):
        assert f"[{flag}" in USAGE


def test_serve_help_names_every_flag_before_vllms_help(
    launcher_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from offload_vllm.__main__ import USAGE

    assert main(["serve", "--help"]) == 0  # vLLM's help is the recorder here
    assert capsys.readouterr().out.startswith(f"usage: {USAGE}")


def test_prefix_tokenization_and_cross_request_batching_are_on_unless_turned_off() -> None:
    on = read_settings({"OFFLOAD_VLLM_STRATEGY": "async-renderer"})
    assert (on.prefix_tokenize, on.batch_across_requests) == (True, True)
    off = read_settings(
        {
            "OFFLOAD_VLLM_STRATEGY": "async-renderer",
            "OFFLOAD_VLLM_PREFIX_TOKENIZE": "0",
            "OFFLOAD_VLLM_BATCH_ACROSS_REQUESTS": "off",
        }
    )
    assert (off.prefix_tokenize, off.batch_across_requests) == (False, False)
    assert "prefix_tokenize=off batch_across_requests=off" in off.summary()
    # Prefix tokenization applies to every strategy; batching only where tokenization is batched.
    assert read_settings({"OFFLOAD_VLLM_STRATEGY": "inline", "OFFLOAD_VLLM_PREFIX_TOKENIZE": "0"}).prefix_tokenize is False
    with pytest.raises(OffloadVLLMConfigError, match="it does not batch tokenization"):
        read_settings({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_BATCH_ACROSS_REQUESTS": "0"})
    with pytest.raises(OffloadVLLMConfigError, match="is not a switch"):
        read_settings({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_PREFIX_TOKENIZE": "maybe"})


def test_health_port_and_its_bound_are_read() -> None:
    settings = read_settings({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_HEALTH_PORT": "8081"})
    assert (settings.health_port, settings.health_max_stall) == (8081, 5.0)
    assert "health_port=8081 health_max_stall=5s" in settings.summary()
    settings = read_settings(
        {"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_HEALTH_PORT": "8081", "OFFLOAD_VLLM_HEALTH_MAX_STALL": "2.5"}
    )
    assert settings.health_max_stall == 2.5
    assert read_settings({"OFFLOAD_VLLM_STRATEGY": "thread"}).health_port is None


def test_the_health_port_is_taken_without_a_strategy() -> None:
    """The health port and its bound, the only settings taken with no strategy
    (vLLM keeps its own behaviour); the summary then shows only them."""
    alone = read_settings({"OFFLOAD_VLLM_HEALTH_PORT": "8081", "OFFLOAD_VLLM_HEALTH_MAX_STALL": "2.5"})
    assert (alone.strategy, alone.health_port, alone.health_max_stall) == (None, 8081, 2.5)
    assert alone.summary() == "strategy=(vLLM default) health_port=8081 health_max_stall=2.5s"
    assert read_settings({}).summary() == "strategy=(vLLM default)"
    assert [option.name for option in OPTIONS if option.without_strategy] == ["health_port", "health_max_stall"]


def test_the_validation_shortcut_is_on_unless_turned_off() -> None:
    on = read_settings({"OFFLOAD_VLLM_STRATEGY": "thread"})
    assert on.validation_shortcut is True
    assert "validation_shortcut" not in on.summary()
    off = read_settings({"OFFLOAD_VLLM_STRATEGY": "process", "OFFLOAD_VLLM_VALIDATION_SHORTCUT": "off"})
    assert off.validation_shortcut is False
    assert "validation_shortcut=off" in off.summary()
    with pytest.raises(OffloadVLLMConfigError, match="is not a switch"):
        read_settings({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_VALIDATION_SHORTCUT": "maybe"})
