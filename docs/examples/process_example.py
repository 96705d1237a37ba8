"""The `process` strategy: per-worker state, a crash that fails only its own call,
and a large array that travels through shared memory."""

import asyncio
import os

import numpy as np

import offload


def build_state() -> dict[str, int]:
    # Runs once in each worker process: load the tokenizer, processor, model here.
    return {"pid": os.getpid()}


def normalise(image: np.ndarray) -> np.ndarray:
    """Pure-Python-heavy work would hold the GIL; in a worker it cannot stall the loop."""
    state = offload.worker_state()
    assert state["pid"] == os.getpid()
    return (image - image.mean()) / (image.std() + 1e-6)


def crash() -> None:
    os._exit(3)  # stands in for a segfault in a native extension


async def main() -> None:
    async with offload.get_executor("process", max_workers=2, initializer=build_state) as ex:
        image = np.random.default_rng(0).random((1024, 1024, 3), dtype=np.float32)  # 12 MiB
        out = await ex.run(normalise, image)  # sent and returned through shared memory
        print(f"normalised {out.nbytes >> 20} MiB, mean {out.mean():+.3f}")

        try:
            await ex.run(crash)
        except offload.WorkerCrashed as exc:
            print("crashed:", exc)

        results = await asyncio.gather(*(ex.run(normalise, image[:8]) for _ in range(4)))
        print("the pool still serves:", len(results), "calls after the crash")


if __name__ == "__main__":  # required: worker processes import this module
    asyncio.run(main())
