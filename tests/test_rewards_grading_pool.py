"""The math grading pool under attack: pathological answers from several threads, dead parents, killed workers.

The bug these catch: one math-verify worker behind one lock, so four pathological answers from four threads
finished at 5, 11.5, 17.9 and 23.9 s and a normal answer queued behind them waited 12 s; a timeout was cached as
a permanent "wrong". Time bounds here are the cap plus generous slack for forking on a loaded 2-core machine:
they check that the cap holds per answer, not speed.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trl_ext.rewards import MathReward, grade
from trl_ext.rewards import math as rmath
from trl_ext.rewards.grading_pool import GradingPool, GradingTimeout, get_grading_pool
from trl_ext.rewards.math_prechecks import explosive

CAP_S = 1.0
SLACK_S = 4.0  # forking extra workers and scheduling on a loaded machine, never sympy work
TOWER = "9^{9^{9^9}}"  # never returns in sympy; sent straight to a pool (the pre-checks would stop it in grade)
EVADES_PRECHECKS = "(x+1)^{999}"  # sympy expands it for many seconds; an exponent of 999 is below the limit


@pytest.fixture(scope="module")
def pool():
    pool = GradingPool(workers=2, max_workers=8)
    assert pool.verify("\\sqrt{8}", "2\\sqrt{2}", timeout=120) is True  # template started outside the timings
    yield pool
    pool.close()


def _timed(results: dict, key, function, *args) -> None:
    start = time.perf_counter()
    try:
        value = function(*args)
    except GradingTimeout:
        value = "timeout"
    results[key] = (value, time.perf_counter() - start, time.perf_counter())


def test_pathological_answers_from_several_threads_each_stop_at_the_cap(pool):
    """Six power towers and two normal answers at once on a 2-worker pool: every tower stops at the cap, the
    normal answers are not queued behind them, and nothing is serialised (a single worker behind a lock finishes four
    such answers at 5, 11.5, 17.9, 23.9 s)."""
    results = {}
    threads = [threading.Thread(target=_timed, args=(results, i, pool.verify, "1", TOWER, CAP_S)) for i in range(6)]
    # The normal answers get a long cap of their own: on a loaded machine a 1 s cap could flip them, and the
    # point here is that they are not queued behind the towers.
    threads += [
        threading.Thread(target=_timed, args=(results, "sqrt", pool.verify, "\\sqrt{27}", "3\\sqrt{3}", 30)),
        threading.Thread(target=_timed, args=(results, "poly", pool.verify, "x^2+2x+1", "(x+1)^2", 30)),
    ]
    timeouts_before = pool.stats["timeouts"]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    wall = time.perf_counter() - start
    assert [results[i][0] for i in range(6)] == ["timeout"] * 6
    assert all(CAP_S <= results[i][1] < CAP_S + SLACK_S for i in range(6)), results
    assert results["sqrt"][0] is True and results["poly"][0] is True, results
    assert max(results["sqrt"][1], results["poly"][1]) < CAP_S + SLACK_S, results
    assert wall < CAP_S + SLACK_S  # six caps run side by side, not one after another
    assert pool.stats["timeouts"] == timeouts_before + 6
    assert pool.verify("\\frac{1}{2}", "0.5", 30) is True  # killed workers were replaced


def test_a_normal_answer_is_not_queued_behind_slow_ones(pool):
    """Both workers held by towers (3 s cap): a normal answer gets a fresh worker once they turn slow (half the
    cap) and is answered before the towers stop; with a fixed pool it would wait for a tower to be killed."""
    done = {}
    towers = [threading.Thread(target=_timed, args=(done, i, pool.verify, "1", TOWER, 3.0)) for i in range(2)]
    for thread in towers:
        thread.start()
    time.sleep(0.3)  # both towers are in the workers
    forked = pool.stats["workers_forked"]
    assert pool.verify("x+x", "2x", 30) is True
    normal_done = time.perf_counter()
    for thread in towers:
        thread.join(timeout=60)
    assert [value for value, _, _ in done.values()] == ["timeout", "timeout"]
    assert pool.stats["workers_forked"] > forked
    assert normal_done < min(end for _, _, end in done.values())


def test_timeouts_score_zero_are_logged_and_not_cached(monkeypatch):
    """Through the TRL callable: towers are rejected by the pre-checks (no worker time), an answer that evades
    them hits the cap, scores 0, is counted in `grading_timeouts`, is remembered for `TIMEOUT_MEMORY_S` only (the
    next group pays no second cap) and is graded again after that: a timeout is not a verdict."""
    assert explosive(TOWER) and not explosive(EVADES_PRECHECKS)
    get_grading_pool().verify("1", "1", 120)  # template started outside the timings
    reward = MathReward("r1_zero", timeout=CAP_S)
    completions = [f"r </think> <answer> {a} </answer>" for a in (TOWER, "100000000!", EVADES_PRECHECKS, "2")]
    metrics = {}
    start = time.perf_counter()
    rewards = reward(completions, ground_truth=["2"] * 4, log_metric=metrics.__setitem__)
    assert rewards == [0.0, 0.0, 0.0, 1.0]  # "2" vs "2" is settled by the string stage
    assert time.perf_counter() - start < CAP_S + SLACK_S
    assert metrics["rewards/r1_zero_reward/grading_timeouts"] == 1
    assert metrics["rewards/r1_zero_reward/grading_rejected"] == 2
    key = ("2", EVADES_PRECHECKS)
    assert key not in rmath._VERDICTS and key in rmath._TIMED_OUT
    pool = get_grading_pool()
    timeouts = pool.stats["timeouts"]
    start = time.perf_counter()
    assert reward(completions[2:3], ground_truth=["2"], log_metric=metrics.__setitem__) == [0.0]
    assert time.perf_counter() - start < CAP_S / 2 and pool.stats["timeouts"] == timeouts  # remembered
    assert metrics["rewards/r1_zero_reward/grading_timeouts"] == 1  # and still counted
    monkeypatch.setitem(rmath._TIMED_OUT, key, time.monotonic())  # the memory ran out
    assert grade(EVADES_PRECHECKS, "2", timeout=0.3) is False
    assert pool.stats["timeouts"] == timeouts + 1  # asked the pool again


def test_pickled_reward_keeps_its_time_cap():
    clone = pickle.loads(pickle.dumps(MathReward("question_only", timeout=0.25)))
    assert (clone.__name__, clone.timeout) == ("question_only_reward", 0.25)
    assert clone(["\\boxed{\\frac{6}{4}}"], ground_truth=["1.5"]) == [1.0]
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        MathReward(timeout=0)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_a_killed_parent():
    """A parent killed with SIGKILL cannot clean up; its template and the worker busy on a tower still exit."""
    script = (
        "import threading\n"
        "from trl_ext.rewards.grading_pool import GradingPool\n"
        "pool = GradingPool(workers=1)\n"
        "pool.verify('1', '1', 120)\n"
        "worker = pool._idle[0]\n"
        "print(pool._template.pid, worker.pid, flush=True)\n"
        "pool.verify('1', '9^{9^{9^9}}', 600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        template, worker = map(int, parent.stdout.readline().split())
        time.sleep(1.0)  # the tower is in the worker now
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (_alive(template) or _alive(worker)):
        time.sleep(0.2)
    survivors = [pid for pid in (template, worker) if _alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "grading processes outlived their killed parent by 15 s"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_zombies_after_timeouts(pool):
    for _ in range(3):
        with pytest.raises(GradingTimeout):
            pool.verify("1", TOWER, 0.2)
    assert pool.verify("x+x", "2x", 30) is True  # a fresh worker
    time.sleep(0.5)
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pool._template.pid:
            children.append(fields[0])
    assert children and "Z" not in children  # live idle workers, no unreaped dead ones
    assert len(children) <= pool.workers  # extra workers exit when they fall idle


def test_a_worker_killed_from_outside_is_replaced_without_a_wrong_grade(pool):
    assert pool.verify("\\sqrt{8}", "2\\sqrt{2}", 30) is True
    lost = pool.stats["workers_lost"]
    os.kill(pool._idle[-1].pid, signal.SIGKILL)  # the worker the next call takes; the pool is not told
    assert pool.verify("\\sqrt{27}", "3\\sqrt{3}", 30) is True  # not a false "wrong"
    assert pool.stats["workers_lost"] == lost + 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_pool():
    get_grading_pool().verify("1", "1", 120)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            ok = grade("x^2-1", "(x-1)(x+1)", timeout=30) and get_grading_pool()._pid == os.getpid()
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert grade("x^2-1", "(x+1)(x-1)", timeout=30) is True  # the parent's pool still works


def test_pool_size_from_the_environment(monkeypatch):
    monkeypatch.setenv("TRL_EXT_GRADING_WORKERS", "3")
    assert (GradingPool().workers, GradingPool().max_workers) == (3, 12)
    monkeypatch.setenv("TRL_EXT_GRADING_WORKERS", "many")
    with pytest.raises(ValueError, match="TRL_EXT_GRADING_WORKERS must be a positive integer, got 'many'"):
        GradingPool()
    with pytest.raises(ValueError, match="1 <= workers <= max_workers"):
        GradingPool(workers=4, max_workers=2)
