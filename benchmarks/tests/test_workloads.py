"""The benchmarks' request bodies (benchmarks/harness/workloads.py)."""

from __future__ import annotations

import json

import pytest

from benchmarks.harness import workloads


def test_a_rotation_encodes_each_body_once_and_sends_it_in_turn() -> None:
    rotation = workloads.rerank_factory("m", documents=2, words=20, keep=8)
    assert [rotation(i) is rotation(i + 4) for i in range(4)] == [True] * 4
    assert [json.loads(rotation.body(i)) for i in range(8)] == [rotation(i) for i in range(8)]
    assert all(rotation.body(i) is rotation.body(i + 4) for i in range(4))  # not encoded again
    with pytest.raises(ValueError, match="at least one"):
        workloads.Rotation([])
