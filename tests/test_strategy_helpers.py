"""The helpers `offload.strategy` gives authors of strategies whose workers are
other processes (a whole strategy built on them: docs/examples/pool_strategy.py,
checked by the contract suite in tests/test_contract.py)."""

from __future__ import annotations

import pickle
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor

import pytest

import offload
from offload.strategy import (
    by_reference,
    count_worker_restart,
    portable_error,
    run_on_each_worker,
    set_worker_state,
)

from . import helpers


def test_by_reference_sends_a_make_async_decorated_function() -> None:
    original = helpers.doubled_in_a_process.__wrapped__  # type: ignore[attr-defined]
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(original)  # its name finds the wrapper
    assert pickle.loads(pickle.dumps(by_reference(original))) is original
    assert by_reference(helpers.add) is helpers.add


def test_portable_error_keeps_type_message_and_frames() -> None:
    try:
        helpers.raise_custom("boom")
    except helpers.CustomError as exc:
        sent = pickle.loads(pickle.dumps(portable_error(exc)))
    assert type(sent) is helpers.CustomError
    assert sent.args == ("boom",)
    assert "raise_custom" in "".join(traceback.format_exception(sent))


def test_portable_error_of_an_unpicklable_exception_is_an_offload_error_with_its_traceback() -> None:
    try:
        helpers.raise_unpicklable("locked")
    except helpers.UnpicklableError as exc:
        sent = pickle.loads(pickle.dumps(portable_error(exc)))
    assert isinstance(sent, offload.OffloadError)
    assert "UnpicklableError: locked" in str(sent)
    assert "raise_unpicklable" in str(sent)


def test_set_worker_state_is_what_worker_state_returns_on_this_thread() -> None:
    previous = set_worker_state({"tokenizer": "mine"})
    try:
        assert offload.worker_state() == {"tokenizer": "mine"}
    finally:
        set_worker_state(previous)
    with pytest.raises(offload.OffloadError, match="worker_state"):
        offload.worker_state()


def test_count_worker_restart_given_a_name_says_it_takes_the_strategy() -> None:
    with pytest.raises(TypeError, match=r"takes the strategy \(self\), not its name"):
        count_worker_restart("pool", "crashed")  # type: ignore[arg-type]


def test_portable_error_checks_with_the_transports_dumps() -> None:
    """What "can be pickled" means is the worker's transport's: an exception
    its `dumps` refuses becomes `OffloadError`, one it carries (a class pickle
    cannot find by name, as cloudpickle carries it by value) stays itself."""

    class LocalError(Exception):
        pass

    def refuse(obj: object) -> bytes:
        raise TypeError("not this transport")

    try:
        helpers.raise_custom("boom")
    except helpers.CustomError as exc:
        refused = portable_error(exc, dumps=refuse)
    assert isinstance(refused, offload.OffloadError)
    assert "raise_custom" in str(refused)

    local = LocalError("here")
    assert isinstance(portable_error(local), offload.OffloadError)  # pickle cannot find the class
    assert portable_error(local, dumps=lambda obj: pickle.dumps(None)) is local


def test_run_on_each_worker_starts_that_many_workers_of_a_pool_that_reuses_idle_ones() -> None:
    """A `ThreadPoolExecutor` starts a thread only when none is idle: a
    quick function run N times one after another may use one thread; with
    `run_on_each_worker` every run has a thread of its own, the way a
    strategy whose slots share one pool warms it in `start()`."""
    with ThreadPoolExecutor(3) as pool:
        threads = run_on_each_worker(pool, 3, threading.get_ident)
        assert len(set(threads)) == 3
        assert len(set(run_on_each_worker(pool, 3, threading.get_ident)) | set(threads)) == 3  # warm already


def test_run_on_each_worker_reports_a_pool_too_small_and_the_function_s_error() -> None:
    with ThreadPoolExecutor(1) as pool, pytest.raises(offload.OffloadError, match="did not run 2 calls at once"):
        run_on_each_worker(pool, 2, threading.get_ident, timeout=0.2)

    def refuse() -> None:
        raise ValueError("nope")

    with ThreadPoolExecutor(2) as pool, pytest.raises(ValueError, match="nope"):
        run_on_each_worker(pool, 2, refuse, timeout=5)
