"""The slot pool on its own, without RQ, Redis or PostgreSQL: how many run at once, how a
freed slot waits for the others of its take, and how a warm stop drains
(:mod:`duejobs.worker.slot_pool`).

Seen failing against a pool broken on purpose: ``_done`` not releasing the slot →
``test_never_more_run_at_once_than_the_pool_has_slots`` (hangs at its deadline);
``await_others`` not waiting → ``test_a_freed_slot_waits_for_the_others_of_its_take``;
``close`` not counting the given-up slots → ``test_a_warm_stop_with_a_slot_given_up_exits_wedged``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from duejobs.worker import EXIT_WEDGED
from duejobs.worker.slot_pool import SlotPool
from tests.support import wait_for


def _blocked(pool: SlotPool, key: str, release: threading.Event) -> None:
    """Hold a slot for ``key`` until ``release`` is set."""
    assert pool.acquire(5)
    pool.run(key, lambda: release.wait(30) and None)


def _take_of_two_with_one_freed(pool: SlotPool) -> threading.Event:
    """Two jobs taken together on two slots; the first has returned, the second runs until
    the event returned is set."""
    quick, slow = threading.Event(), threading.Event()
    assert pool.acquire(1) and pool.acquire(1)
    pool.took(["quick", "slow"])
    pool.run("quick", lambda: quick.wait(30) and None)
    pool.run("slow", lambda: slow.wait(30) and None)
    quick.set()
    wait_for(lambda: pool.busy == 1, 10, "the quick slot to free")
    return slow


def test_never_more_run_at_once_than_the_pool_has_slots() -> None:
    pool = SlotPool(3, take_window=0)
    running, most, lock = 0, 0, threading.Lock()

    def work() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.01)
        with lock:
            running -= 1

    for i in range(30):
        assert pool.acquire(10), "a slot never freed"
        pool.run(str(i), work)
    pool.close()
    assert most == 3


def test_acquire_free_holds_every_free_slot_and_release_gives_them_back() -> None:
    pool = SlotPool(4, take_window=0)
    release = threading.Event()
    _blocked(pool, "a", release)
    assert pool.acquire_free() == 3
    assert not pool.acquire(0.01)
    pool.release(3)
    assert pool.acquire_free() == 3
    pool.release(3)
    release.set()
    pool.close()


def test_a_job_taken_that_will_not_run_frees_its_slot() -> None:
    pool = SlotPool(1, take_window=0)
    assert pool.acquire(1)
    pool.took(["a"])
    assert pool.taken_at("a") is not None
    pool.drop("a")
    assert pool.taken_at("a") is None
    assert pool.acquire(1)
    pool.release()
    pool.close()


def test_a_freed_slot_waits_for_the_others_of_its_take() -> None:
    pool = SlotPool(2, take_window=30)
    slow = _take_of_two_with_one_freed(pool)
    waited = threading.Thread(target=pool.await_others, args=(lambda: False,))
    waited.start()
    waited.join(0.2)
    assert waited.is_alive(), "the freed slot took at once, not waiting for its take"
    slow.set()
    waited.join(10)
    assert not waited.is_alive(), "the wait went on after the take's last slot freed"
    pool.close()


def test_a_take_is_waited_for_once_and_never_past_its_window() -> None:
    pool = SlotPool(2, take_window=0.05)
    slow = _take_of_two_with_one_freed(pool)
    started = time.monotonic()
    pool.await_others(lambda: False)  # the slow one never frees: the window ends the wait
    assert time.monotonic() - started < 10
    again = time.monotonic()
    pool.await_others(lambda: False)  # that take had its wait
    assert time.monotonic() - again < 0.05
    slow.set()
    pool.close()


def test_a_stop_ends_the_wait_for_a_take() -> None:
    pool = SlotPool(2, take_window=30)
    slow, stop = _take_of_two_with_one_freed(pool), threading.Event()
    waited = threading.Thread(target=pool.await_others, args=(stop.is_set,))
    waited.start()
    stop.set()
    waited.join(10)  # seen at the next wake, within a second
    assert not waited.is_alive()
    slow.set()
    pool.close()


def test_a_warm_stop_waits_for_the_running_slots() -> None:
    pool = SlotPool(2, take_window=0)
    release = threading.Event()
    _blocked(pool, "a", release)
    closing = threading.Thread(target=pool.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive(), "the stop did not wait for a running slot"
    release.set()
    closing.join(10)
    assert not closing.is_alive() and pool.busy == 0


def test_an_error_out_of_a_run_frees_its_slot() -> None:
    pool = SlotPool(1, take_window=0)

    def fails() -> None:
        raise RuntimeError("out of the job")

    assert pool.acquire(1)
    pool.run("a", fails)
    assert pool.acquire(10), "the slot of a run that raised never freed"
    pool.release()
    pool.close()


def test_a_warm_stop_with_a_slot_given_up_exits_wedged() -> None:
    """A handler given up will not return: the stop waits for the others, then the process
    exits with EXIT_WEDGED for its supervisor (in a process of its own here)."""
    script = """
import threading
from duejobs.worker.slot_pool import SlotPool
pool = SlotPool(2, take_window=0)
assert pool.acquire(1)
pool.run("stuck", lambda: threading.Event().wait())
assert pool.give_up() == 1
pool.close()
raise SystemExit(0)
"""
    done = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True)
    assert done.returncode == EXIT_WEDGED, done.stderr.decode()


def test_a_handler_given_up_that_returns_lets_the_stop_end_cleanly() -> None:
    pool = SlotPool(2, take_window=0)
    release = threading.Event()
    _blocked(pool, "a", release)
    assert pool.give_up() == 1
    pool.returned()
    release.set()
    pool.close()
    assert pool.wedged == 0 and pool.busy == 0
