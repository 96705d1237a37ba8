"""Fast checks of the adapter's settings and plugin load: no server."""

from __future__ import annotations

import os
import subprocess
import sys

import offload_vllm
import pytest
from offload_vllm import (
    OffloadVLLMConfigError,
    _seams,
    read_settings,
)

import offload

# A few tests import vLLM in a fresh interpreter: seconds when idle, minutes on a busy machine.
pytestmark = pytest.mark.timeout(600)


def test_unset_keeps_vllm_behaviour() -> None:
    settings = read_settings({})
    assert settings.strategy is None
    assert settings.workers is None


@pytest.mark.parametrize("strategy", [s for s in offload_vllm.ADAPTER_STRATEGIES if s in offload.STRATEGIES])
def test_strategy_from_vllm_variable_first(strategy: str) -> None:
    settings = read_settings({"VLLM_OFFLOAD_STRATEGY": strategy, "OFFLOAD_STRATEGY": "inline"})
    assert (settings.strategy, settings.strategy_source) == (strategy, "VLLM_OFFLOAD_STRATEGY")


def test_falls_back_to_offload_strategy() -> None:
    settings = read_settings({"OFFLOAD_STRATEGY": "thread"})
    assert (settings.strategy, settings.strategy_source) == ("thread", "OFFLOAD_STRATEGY")


def test_workers() -> None:
    assert read_settings({"VLLM_OFFLOAD_STRATEGY": "thread", "VLLM_OFFLOAD_WORKERS": " 3 "}).workers == 3


@pytest.mark.skipif("ray" not in offload.STRATEGIES, reason="offload-ray is not installed here")
def test_ray_address() -> None:
    settings = read_settings({"VLLM_OFFLOAD_STRATEGY": "ray", "VLLM_OFFLOAD_RAY_ADDRESS": " ray://head:10001 "})
    assert (settings.strategy, settings.ray_address) == ("ray", "ray://head:10001")
    assert read_settings({"VLLM_OFFLOAD_STRATEGY": "ray", "VLLM_OFFLOAD_WORKERS": "3"}).workers == 3


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"VLLM_OFFLOAD_STRATEGY": "threads"}, "'threads' is not a strategy the vLLM adapter supports; valid: inline, thread, process, async-renderer, ray"),
        ({"OFFLOAD_STRATEGY": "fork"}, "OFFLOAD_STRATEGY='fork'"),
        ({"VLLM_OFFLOAD_STRATEGY": "thread", "VLLM_OFFLOAD_WORKERS": "0"}, "must be >= 1"),
        ({"VLLM_OFFLOAD_STRATEGY": "thread", "VLLM_OFFLOAD_WORKERS": "two"}, "is not an integer"),
        ({"VLLM_OFFLOAD_STRATEGY": "inline", "VLLM_OFFLOAD_WORKERS": "2"}, "has no effect with strategy 'inline'"),
        ({"VLLM_OFFLOAD_STRATEGY": "async-renderer", "VLLM_OFFLOAD_WORKERS": "2"}, "has no effect with strategy 'async-renderer'"),
        ({"VLLM_OFFLOAD_WORKERS": "2"}, "has no effect with no strategy set"),
        ({"VLLM_OFFLOAD_STRATEGY": "thread", "VLLM_OFFLOAD_WOKRERS": "2"}, "unknown setting(s) VLLM_OFFLOAD_WOKRERS"),
        ({"VLLM_OFFLOAD_STRATEGY": "process", "VLLM_OFFLOAD_RAY_ADDRESS": "auto"}, "has no effect with strategy 'process'; unset it, or set VLLM_OFFLOAD_STRATEGY=ray"),
        ({"VLLM_OFFLOAD_RAY_ADDRESS": "auto"}, "VLLM_OFFLOAD_RAY_ADDRESS='auto' has no effect with no strategy set"),
    ],
)
def test_bad_values_name_themselves(env: dict[str, str], message: str) -> None:
    with pytest.raises(OffloadVLLMConfigError) as info:
        read_settings(env)
    assert message in str(info.value)
    assert isinstance(info.value, offload.ConfigError)


@pytest.mark.parametrize("strategy", offload_vllm.ADAPTER_STRATEGIES)
def test_strategy_missing_from_offload_is_refused(strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older `offload` without one of the adapter's strategies is refused by name."""
    monkeypatch.setattr(offload, "STRATEGIES", tuple(s for s in offload.STRATEGIES if s != strategy))
    with pytest.raises(OffloadVLLMConfigError, match="does not provide this strategy"):
        read_settings({"VLLM_OFFLOAD_STRATEGY": strategy})


def test_installed_vllm_has_every_seam() -> None:
    assert _seams.check_seams() == []
    assert _seams.vllm_version() in _seams.TESTED_VLLM_VERSIONS


def test_missing_seam_fails_naming_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        _seams, "REQUIRED", (*_seams.REQUIRED, _seams.Seam("vllm.renderers.base", "BaseRenderer", "no_such_seam"))
    )
    monkeypatch.setattr(_seams, "vllm_version", lambda: "9.9.9")
    with pytest.raises(offload_vllm.UnsupportedVLLMVersion) as info:
        _seams.require_supported_vllm()
    text = str(info.value)
    assert "vLLM 9.9.9" in text
    assert "vllm.renderers.base.BaseRenderer.no_such_seam" in text
    assert "0.32.0" in text


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_OFFLOAD_", "OFFLOAD_"))}
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, check=False, capture_output=True, text=True, timeout=300
    )


def test_vllm_plugin_load_stops_on_bad_value() -> None:
    """What vLLM does at start (`load_general_plugins`) raises: the server never comes up."""
    proc = _python(
        "from vllm.plugins import load_general_plugins; load_general_plugins()",
        VLLM_OFFLOAD_STRATEGY="bogus",
    )
    assert proc.returncode != 0
    assert "OffloadVLLMConfigError" in proc.stderr
    assert "VLLM_OFFLOAD_STRATEGY='bogus'" in proc.stderr


def test_vllm_plugin_load_patches_seams() -> None:
    proc = _python(
        "from vllm.plugins import load_general_plugins; load_general_plugins()\n"
        "from vllm.entrypoints.pooling.base.io_processor import PoolingIOProcessor\n"
        "import offload_vllm\n"
        "print(offload_vllm.active_strategy(), PoolingIOProcessor.__init__.__offload_vllm__)",
        VLLM_OFFLOAD_STRATEGY="thread",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-2:] == ["thread", "True"]


def test_launcher_refuses_bad_value_before_starting_vllm() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "offload_vllm", "serve", "some-model", "--offload-strategy", "nope"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "offload-vllm: VLLM_OFFLOAD_STRATEGY='nope' is not a strategy" in proc.stderr


def test_launcher_usage() -> None:
    proc = subprocess.run([sys.executable, "-m", "offload_vllm"], check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "python -m offload_vllm serve MODEL" in proc.stderr
