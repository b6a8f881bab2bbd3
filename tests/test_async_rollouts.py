"""Asynchronous rollouts without a server: the config's refusals and default (`async_rollouts`, `max_staleness`),
the staleness rule, the request sent ahead (TRL's last request with the next prompts), and the background worker
(one request in flight, answered only to the identical request, its errors raised on the main thread).

The real-engine runs (versions, the bound, the importance ratio against the sampler's log-probs, equivalence with
the synchronous path) are in tests/test_vllm_server_sync.py's module, which shares its server."""

from __future__ import annotations

import threading

import pytest

from trl_ext import AblationGRPOConfig
from trl_ext.grpo.rollouts.async_rollouts import check_trainer_inputs, optimizer_steps_per_generation
from trl_ext.grpo.vllm.replay import RolloutWorker, is_stale, next_payload

BASE = dict(report_to="none", use_cpu=True, save_strategy="no", use_vllm=True, vllm_mode="server")


def make(tmp_path, **kwargs) -> AblationGRPOConfig:
    return AblationGRPOConfig(output_dir=str(tmp_path), **{**BASE, **kwargs})


@pytest.mark.parametrize(
    ("layout", "steps"),
    [
        # 8 completions per micro-batch; generation batch = steps_per_generation micro-batches; GA per step.
        (dict(per_device_train_batch_size=8, num_generations=4), 1),  # on-policy: 1 step per batch
        (dict(per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2), 1),
        (dict(per_device_train_batch_size=4, num_generations=4, steps_per_generation=4), 4),  # 4 steps of 1
        (dict(per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2, num_iterations=3), 3),
        # the courses' vocabulary: rollout 64, train 16 -> 4 optimizer steps per rollout
        (dict(group_size=8, rollout_batch_size=64, train_batch_size=16, gradient_accumulation_steps=2), 4),
    ],
)
def test_default_staleness_is_one_generation_batch_of_optimizer_steps(tmp_path, layout, steps):
    cfg = make(tmp_path, async_rollouts=True, **layout)
    # m = steps_per_generation * num_iterations / GA, by hand above.
    assert optimizer_steps_per_generation(cfg) == steps
    assert cfg.max_staleness == steps


def test_staleness_between_zero_and_m_is_kept(tmp_path):
    for staleness in (0, 1, 2, 3, 4):
        cfg = make(tmp_path, async_rollouts=True, max_staleness=staleness, per_device_train_batch_size=4,
                   num_generations=4, steps_per_generation=4)  # fmt: skip
        assert cfg.max_staleness == staleness


def test_staleness_zero_needs_no_sampler_correction(tmp_path):
    cfg = make(tmp_path, async_rollouts=True, max_staleness=0, vllm_importance_sampling_correction=False)
    assert cfg.max_staleness == 0


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(max_staleness=1), ["max_staleness=1", "without async_rollouts"]),
        (dict(async_rollouts=True, vllm_mode="colocate"), ["vllm_mode='colocate'", "vllm_mode='server'"]),
        (dict(async_rollouts=True, use_vllm=False), ["use_vllm=False", "use_vllm=True"]),
        (dict(async_rollouts=True, max_staleness=2), ["max_staleness=2", "from 0 (synchronous) to 1"]),
        (dict(async_rollouts=True, max_staleness=-1), ["max_staleness=-1"]),
        (dict(async_rollouts=True, max_staleness=True), ["max_staleness=True"]),
        (
            dict(async_rollouts=True, vllm_importance_sampling_correction=False),
            ["max_staleness=1", "vllm_importance_sampling_correction=True"],
        ),
        # 2 micro-batches per generation batch, 4 per optimizer step: half an optimizer step per batch.
        (
            dict(
                async_rollouts=True,
                per_device_train_batch_size=4,
                num_generations=4,
                steps_per_generation=2,
                gradient_accumulation_steps=4,
            ),
            ["whole optimizer steps", "gradient_accumulation_steps=4"],
        ),  # fmt: skip
    ],
)
def test_refusals_name_the_field_and_the_fix(tmp_path, kwargs, words):
    with pytest.raises(ValueError) as error:
        make(tmp_path, **kwargs)
    for word in words:
        assert word in str(error.value)


def test_plain_config_has_no_async(tmp_path):
    cfg = make(tmp_path)
    assert (cfg.async_rollouts, cfg.max_staleness) == (False, None)


@pytest.mark.parametrize("name", ["rollout_func", "tools", "environment_factory"])
def test_trainer_inputs_that_generate_otherwise_are_refused(name):
    with pytest.raises(ValueError, match=name):
        check_trainer_inputs({name: [print]})
    check_trainer_inputs({name: None})


def test_image_datasets_are_refused():
    from datasets import Dataset

    with pytest.raises(ValueError, match="eval_dataset has image columns"):
        check_trainer_inputs({"eval_dataset": Dataset.from_dict({"prompt": ["a"], "image": [None]})})


def test_stale_means_more_than_the_bound_behind():
    # version v sampled, scored at step g: lag g - v; stale only beyond the bound.
    assert not is_stale(version=3, global_step=4, max_staleness=1)
    assert is_stale(version=2, global_step=4, max_staleness=1)
    assert not is_stale(version=4, global_step=4, max_staleness=0)
    assert is_stale(version=3, global_step=4, max_staleness=0)


def test_next_payload_is_the_last_request_with_the_next_prompts():
    template = {"model": "m", "prompt": [[1, 2]], "n": 4, "temperature": 1.0, "stop": ["</answer>"], "logprobs": 0}
    payload = next_payload(template, [(5, 6, 7), (8,)])
    assert payload == {"model": "m", "prompt": [[5, 6, 7], [8]], "n": 4, "temperature": 1.0, "stop": ["</answer>"],
                       "logprobs": 0}  # fmt: skip
    assert template["prompt"] == [[1, 2]]  # the template is not changed


class GatedPost:
    """A `post(url, payload)` that answers when released: the background request, observable from the test."""

    def __init__(self, fail: bool = False):
        self.release, self.calls, self.fail = threading.Event(), [], fail
        self.threads = []

    def __call__(self, url, payload):
        self.calls.append((url, payload))
        self.threads.append(threading.current_thread().name)
        assert self.release.wait(10)
        if self.fail:
            raise ConnectionError("server gone")
        return {"choices": [payload["prompt"]]}, 0.25


def test_worker_answers_only_the_identical_request():
    post = GatedPost()
    worker = RolloutWorker(post)
    prefetch = worker.submit("u/v1/completions", {"prompt": [[1]], "n": 2}, version=7)
    assert prefetch.version == 7
    with pytest.raises(RuntimeError, match="already in flight"):
        worker.submit("u/v1/completions", {"prompt": [[2]]}, version=7)
    assert worker.take("u/v1/completions", {"prompt": [[1]], "n": 3}) is None  # another request: left in flight
    assert worker.take("other", {"prompt": [[1]], "n": 2}) is None
    post.release.set()
    taken = worker.take("u/v1/completions", {"prompt": [[1]], "n": 2})
    assert taken is prefetch and taken.future.result() == {"choices": [[[1]]]}
    assert taken.seconds == 0.25  # the server's time, as the post measured it
    assert worker.pending is None
    assert post.threads == ["trl-ext-rollout"]  # posted from the background thread
    assert worker.wait() == 0.0  # nothing in flight


def test_worker_error_is_raised_on_the_main_thread():
    post = GatedPost(fail=True)
    worker = RolloutWorker(post)
    worker.submit("u", {"prompt": [[1]]}, version=0)
    post.release.set()
    assert worker.wait() >= 0.0  # waiting does not raise
    with pytest.raises(ConnectionError, match="server gone"):
        worker.take("u", {"prompt": [[1]]})
    assert worker.pending is None


def test_drop_waits_for_the_answer_and_forgets_it():
    post = GatedPost()
    worker = RolloutWorker(post)
    worker.submit("u", {"prompt": [[1]]}, version=0)
    timer = threading.Timer(0.2, post.release.set)
    timer.start()
    dropped = worker.drop()
    assert dropped is not None and dropped.future.done()
    assert worker.pending is None and worker.drop() is None
