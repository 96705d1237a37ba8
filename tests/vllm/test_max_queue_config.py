"""`OFFLOAD_VLLM_MAX_QUEUE` and `--offload-max-queue`: parsed and checked at plugin load."""

from __future__ import annotations

import pytest
from offload_vllm import OffloadVLLMConfigError, read_settings
from offload_vllm.__main__ import main


def test_max_queue_is_read() -> None:
    settings = read_settings({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_MAX_QUEUE": "16"})
    assert settings.max_queue == 16
    assert read_settings({"OFFLOAD_VLLM_STRATEGY": "thread"}).max_queue is None
    assert read_settings({"OFFLOAD_VLLM_STRATEGY": "async-renderer", "OFFLOAD_VLLM_MAX_QUEUE": "0"}).max_queue == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_MAX_QUEUE": "many"}, "not an integer"),
        ({"OFFLOAD_VLLM_STRATEGY": "thread", "OFFLOAD_VLLM_MAX_QUEUE": "-1"}, ">= 0"),
        ({"OFFLOAD_VLLM_STRATEGY": "inline", "OFFLOAD_VLLM_MAX_QUEUE": "4"}, "no queue"),
        ({"OFFLOAD_VLLM_MAX_QUEUE": "4"}, "no strategy set"),
    ],
)
def test_bad_max_queue_is_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(OffloadVLLMConfigError, match=message):
        read_settings(env)


def test_launcher_flag_is_checked(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("OFFLOAD_VLLM_STRATEGY", "OFFLOAD_VLLM_MAX_QUEUE", "OFFLOAD_STRATEGY"):
        # set first, so that the environment main() writes is undone after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    assert main(["serve", "model", "--offload-strategy", "thread", "--offload-max-queue", "nope"]) == 2
    assert "OFFLOAD_VLLM_MAX_QUEUE='nope'" in capsys.readouterr().err


@pytest.mark.parametrize("count", [1, 2, 3, 7])
@pytest.mark.parametrize("bound", [0, 1, 2, 5, 64, 2_000_000.0, 0.5])
def test_a_servers_bound_is_split_between_its_api_servers_adding_up_to_it(bound: float, count: int) -> None:
    """Each of `--api-server-count N` processes admits within its share
    (`server_share`): places and requests as whole numbers as even as they
    go, a cost in N equal parts; the shares add up to the bound."""
    from offload_vllm._runtime import server_share

    shares = [server_share(bound, index, count) for index in range(count)]
    assert sum(shares) == pytest.approx(bound)
    assert max(shares) - min(shares) <= (1 if isinstance(bound, int) else 0)
    assert all(type(share) is type(bound) for share in shares)
    assert server_share(None, 0, count) is None
