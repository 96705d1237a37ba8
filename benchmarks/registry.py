"""The maintained suites: what each answers, how long it takes, where it writes.

`python -m benchmarks` lists them from here; `python -m benchmarks NAME`
runs one (`benchmarks/cli.py`). Every suite is a module with
`main(argv) -> int` that takes `--smoke` (tiny sizes: proves it runs,
measures nothing) and `--out DIR` (default: `.benchmarks/runs/NAME`, ignored by git; the
docs' snapshot in `benchmarks/results/latest/NAME` changes only when a run
names it with `--out`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Suite:
    """One maintained benchmark."""

    name: str
    #: The module whose `main(argv)` runs it.
    module: str
    #: The question its answer table answers.
    question: str
    #: Expected wall-clock minutes with its default arguments on `measured_on`
    #: (the 2-core development machine but for `gpu`), vLLM servers' start-up
    #: included, from the committed runs' own timings where they recorded them.
    minutes: float
    #: What it writes into its output folder.
    output: str
    #: Modules it needs beyond the `bench` extra; listed, and skipped in the
    #: smoke test, where missing.
    requires: tuple[str, ...] = ()
    #: Starts real vLLM servers (the smoke test gives it minutes, not seconds).
    vllm: bool = False
    #: The machine `minutes` was measured on.
    measured_on: str = "2 cores"

    @property
    def command(self) -> str:
        return f"python -m benchmarks {self.name}"


SUITES: tuple[Suite, ...] = (
    Suite("paired", "benchmarks.suites.paired",
          "How much of the API server's CPU does each strategy take per request, against vLLM's default, "
          "with one API server or two?",
          15, "paired.{json,md} (paired-<workload>.* with --workload batch|truncated|rerank|multilingual)", vllm=True),
    Suite("mixed", "benchmarks.suites.mixed",
          "How long does a small request wait under a flood of heavy ones, per strategy?",
          10, "mixed-<variant>.{json,md} (--variant preprocess|engine|score|token-ids|multimodal)", vllm=True),
    Suite("fairness", "benchmarks.suites.fairness",
          "How evenly do lanes and flows share the workers between two backlogged clients (no vLLM)?",
          5, "fairness.{json,md}"),
    Suite("overhead", "benchmarks.suites.overhead",
          "What does one hand-off off the loop cost, against loop.run_in_executor?",
          0.15, "overhead.{json,md}"),
    Suite("startup", "benchmarks.suites.startup",
          "How long does a new user's server take to answer, and what do its workers hold in memory, per strategy?",
          6, "startup.{json,md}", vllm=True),
    Suite("overload", "benchmarks.suites.overload",
          "What does a queue bound do to accepted latency and /health under 128 clients? "
          "(--scenario flood: the operations page's flood against each bound)",
          6, "overload.{json,md} (overload-flood.* with --scenario flood)", vllm=True),
    Suite("generate", "benchmarks.suites.generate",
          "Under Poisson chat traffic with images, what happens to TTFT, /health and timeouts, per strategy and vLLM setting?",
          25, "generate.{json,md}", vllm=True),
    Suite("ray", "benchmarks.suites.ray_cost",
          "What does a call cost under the ray strategy, against process and a bare Ray actor?",
          3, "ray.{json,md}", requires=("ray", "offload_ray")),
    Suite("gpu", "benchmarks.suites.gpu",
          "On a GPU host, which strategy feeds an encoder the most items a second with the loop free (library level)?",
          10, "gpu_library.{json,md} (--smoke runs on CPU)", requires=("torch",),
          measured_on="one H200 GPU, 16 cores"),
)

BY_NAME = {suite.name: suite for suite in SUITES}
