"""The colocated-engine runs of tests/test_vllm_colocate.py, one after the other in ONE process.

Usage: vllm_colocated_runs.py OUT_DIR [NAME ...] (default: every run of RUNS, in its order). Each run is the `main`
of its script under tests/scripts/, writing OUT_DIR/NAME/result.json: a new trainer, and a new colocated engine that
TRL builds for it, per run. The process pays the imports of torch, transformers, TRL and vLLM once instead of once
per run (about 20 of the 35 to 80 CPU seconds each run took in a process of its own on a 2-core CPU).

Each run's engine environment is set before its trainer builds the engine: `colocate` keeps vLLM's compiled graph
(inductor) that users get, the others run it eagerly (`vllm_helpers.EAGER_GRAPH`). vLLM caches its environment
variables once an engine has started (`vllm.envs.enable_envs_cache`); `vllm.envs.disable_envs_cache` drops that
cache so the next engine reads the new values. A run that raises leaves its traceback in OUT_DIR/NAME/error.txt and
the next runs go on; the exit status is then 1.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import resource
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_helpers import EAGER_GRAPH  # noqa: E402

# name: (script module, its main's arguments after OUT_DIR, engine environment)
# `finish_reasons` comes last: its n-gram proposer imports numba, and an engine started after that fails in vLLM's
# scan of every module for Triton kernels to override (`vllm.triton_utils.dispatcher._rebind_kernels` calls
# `vars(value).get` on llvmlite's `_lib_fn_wrapper`: AttributeError).
RUNS = {
    "colocate": ("vllm_colocate", (3,), {}),  # the compiled graph: the only run that covers it
    "dynamic_sampling": ("vllm_dynamic_sampling", (3,), EAGER_GRAPH),
    "expert_iteration": ("vllm_expert_iteration", (), EAGER_GRAPH),
    "finish_reasons": ("vllm_finish_reasons", (), EAGER_GRAPH),
}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def set_engine_env(env: dict[str, str]) -> None:
    """The engine environment of the next run: `env`, and none of the other runs' variables."""
    for name in {k for _, _, run_env in RUNS.values() for k in run_env}:
        os.environ.pop(name, None)
    os.environ.update(env)
    if "vllm.envs" in sys.modules:
        sys.modules["vllm.envs"].disable_envs_cache()


def main(out_dir: Path, names: list[str]) -> int:
    failed = 0
    for name in names:
        module, args, env = RUNS[name]
        run_dir = out_dir / name
        run_dir.mkdir(parents=True, exist_ok=True)
        set_engine_env(env)
        start = cpu_seconds()
        try:
            importlib.import_module(module).main(run_dir, *args)
        except Exception:
            failed = 1
            (run_dir / "error.txt").write_text(traceback.format_exc())
            traceback.print_exc()
        gc.collect()  # the run's trainer and engine
        rss = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmRSS:"))
        record = {"run": name, "cpu_s": round(cpu_seconds() - start, 1), "rss_mib": int(rss) // 1024, "env": env}
        print("vllm_colocated_runs:", json.dumps(record), flush=True)
    return failed


if __name__ == "__main__":  # vLLM may spawn processes: they must not rerun this
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:] or list(RUNS)))
