"""`benchmarks.tools.profile_loop` files each event-loop sample under the innermost frame that names a category."""

from __future__ import annotations

import pytest

from benchmarks.tools.profile_loop import (
    IDLE,
    LOOP_ITSELF,
    OTHER,
    categorize,
    loop_thread_shares,
    main,
    parse_args,
)

MAIN = "thread (1): MainThread"
RUN = "<module> (offload_vllm/__main__.py:72);run (uvloop/__init__.py:92)"


def test_the_innermost_named_frame_decides() -> None:
    # Starlette around offload: offload's frame is deeper, so it wins.
    frames = [*RUN.split(";"), "Starlette.__call__ (starlette/applications.py:1)", "Executor.run (offload/_executor.py:9)"]
    assert categorize(frames) == "offload: executor and adapter"
    # The launcher's own module is not offload's code.
    assert categorize(RUN.split(";")) == LOOP_ITSELF
    assert categorize(["f (mine.py:1)"]) == OTHER


def test_only_the_loop_thread_is_counted() -> None:
    raw = "\n".join(
        [
            f"{MAIN};{RUN};solve_dependencies (fastapi/dependencies/utils.py:1) 3",
            f"{MAIN};{RUN};Socket.send (zmq/sugar/socket.py:1);AsyncMPClient._send_input (vllm/v1/engine/core_client.py:1) 2",
            f"{MAIN};{RUN} 1",
            "thread (2): offload-process-0-1;_Worker.work (offload/_strategies/_process.py:1) 7",
            "not a sample line",
        ]
    )
    total, counts = loop_thread_shares(raw)
    assert total == 6
    assert counts == {
        "FastAPI: body parsing and pydantic validation": 3,
        "vLLM engine client: send to engine (msgspec, zmq)": 2,
        LOOP_ITSELF: 1,
    }


def test_native_frames_never_decide_and_io_waits_are_idle() -> None:
    import collections

    raw = "\n".join(
        [
            f"{MAIN};{RUN};_PyEval_EvalFrameDefault (python3.11);epoll_wait (libc.so.6) 5",
            f"{MAIN};{RUN};_PyEval_EvalFrameDefault (python3.11);Handle__run (uvloop/loop.so) 4",
            f"{MAIN};{RUN};solve_dependencies (fastapi/dependencies/utils.py:1);PyObject_Malloc (python3.11) 2",
        ]
    )
    natives: collections.Counter[str] = collections.Counter()
    total, counts = loop_thread_shares(raw, natives)
    assert total == 6
    assert counts == {LOOP_ITSELF: 4, "FastAPI: body parsing and pydantic validation": 2, IDLE: 5}
    # Waiting in epoll is idle: not a sample of the loop's work.
    assert natives == {"Handle__run": 4}


def test_writes_are_counted_within_their_category() -> None:
    import collections

    answer = "RequestResponseCycle.send (uvicorn/protocols/http/httptools_impl.py:524);UVStream__try_write (loop.c:1)"
    engine = "Socket.send_multipart (zmq/sugar/socket.py:767);Socket.send (zmq/sugar/socket.py:713);0x7f00 (libzmq.so)"
    raw = "\n".join(
        [
            f"{MAIN};{RUN};{answer};write (libc.so.6) 4",
            f"{MAIN};{RUN};{engine};write (libc.so.6) 3",
            f"{MAIN};{RUN};{answer};PyObject_Malloc (python3.11) 2",
            # A worker thread's write is not the loop's.
            "thread (2): offload-thread-0;_AsyncioWaiter.wake (offload/_waiter.py:45);write (libc.so.6) 9",
        ]
    )
    writes: collections.Counter[str] = collections.Counter()
    total, counts = loop_thread_shares(raw, writes=writes)
    http = "HTTP and ASGI (uvicorn, Starlette middleware, routing)"
    zmq = "vLLM engine client: send to engine (msgspec, zmq)"
    assert total == 9
    # Still counted in their categories: the writes are an "of which".
    assert counts == {http: 6, zmq: 3}
    assert writes == {http: 4, zmq: 3}


def test_offload_steps_have_their_own_categories() -> None:
    # Each step of offload's on the loop is named before the catch-all of offload's code.
    door = "RefuseWhenFull.__call__ (offload_vllm/_admission.py:260)"
    assert categorize([*RUN.split(";"), door]) == "offload: door middleware"
    cost = "characters (offload_vllm/_cost.py:200)"
    assert categorize([*RUN.split(";"), door, cost]) == "offload: pricing (a request's cost)"
    plan = "plan_texts (offload_vllm/_prefix/_plan.py:40)"
    assert categorize([*RUN.split(";"), plan]) == "offload: prefix-tokenization planning"
    shortcut = "UnionShortcut.validate (offload_vllm/_seams/validation.py:150)"
    assert categorize([*RUN.split(";"), shortcut]) == "offload: validation shortcut"
    sampler = "_Sampler.run (offload/_lag.py:50);Histogram.observe (prometheus_client/metrics.py:1)"
    assert categorize([*RUN.split(";"), *sampler.split(";")]) == "offload: loop-lag sampler (per second, not per request)"
    assert categorize([*RUN.split(";"), "RequestPolicy.admit (offload_vllm/_admission.py:1)"]) == (
        "offload: executor and adapter"
    )
    # Library code a step calls is filed under what it does: the innermost named frame decides.
    loads = "loads (json/__init__.py:346);JSONDecoder.decode (json/decoder.py:337)"
    assert categorize([*RUN.split(";"), "Request.json (starlette/requests.py:251)", *loads.split(";")]) == (
        "JSON decoding (the request body)"
    )
    dumps = "JSONResponse.render (starlette/responses.py:187);dumps (json/__init__.py:238)"
    assert categorize([*RUN.split(";"), *dumps.split(";")]) == "response encoding (JSON, model_dump)"


def test_the_paired_workloads_are_taken() -> None:
    for workload in ("tiny", "truncated", "rerank", "multilingual"):
        args = parse_args(["--workload", workload, "--rows", "vLLM default", "thread", "--seconds", "10"])
        assert args.workload == workload
        assert args.rows == ["vLLM default", "thread"]
        assert args.seconds == 10.0
    assert parse_args([]).workload == "tiny"


def test_an_unknown_workload_is_refused_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--workload", "no-such-workload"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'no-such-workload'" in capsys.readouterr().err
