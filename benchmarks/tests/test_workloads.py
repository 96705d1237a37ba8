"""The benchmarks' request bodies (benchmarks/harness/workloads.py)."""

from __future__ import annotations

import json
import pickle

from benchmarks.harness import workloads


def test_bodies_are_distinct_json_of_what_they_say() -> None:
    bodies = [json.loads(b) for b in workloads.text_bodies("m", count=3, inputs=4, words=20, truncate=8)]
    assert len({json.dumps(b) for b in bodies}) == 3
    assert all(b["model"] == "m" and b["truncate_prompt_tokens"] == 8 for b in bodies)
    assert [len(t.split()) for b in bodies for t in b["input"]] == [20] * 12
    assert [json.loads(b)["input"] for b in workloads.one_text_bodies("m", count=2, words=5)] == workloads.long_texts(2, 5)
    rerank = [json.loads(b) for b in workloads.rerank_bodies("m", count=2, documents=3, words=10, truncate=5)]
    assert [len(b["documents"]) for b in rerank] == [3, 3]
    assert rerank[0]["documents"] != rerank[1]["documents"]
    assert "truncate_prompt_tokens" not in json.loads(workloads.score_bodies("m", count=1, documents=2, words=4)[0])


def test_a_factory_of_bodies_crosses_to_another_process_and_builds_the_same_bodies() -> None:
    build = workloads.bodies(workloads.token_id_bodies, "m", count=2, inputs=1, ids=5)
    assert pickle.loads(pickle.dumps(build))() == build()
