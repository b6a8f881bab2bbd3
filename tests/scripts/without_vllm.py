"""Runs a Python script as `__main__` with vLLM hidden: `python without_vllm.py SCRIPT [ARGS ...]`.

For the tests' recipe runs with `use_vllm: false` (the transformers backend generates): TRL's GRPO module imports
vLLM whenever it is installed, 8 of the 20 CPU seconds a trainer process spends on imports on a 2-core CPU, and
nothing of it runs. With `sys.modules["vllm"] = None`, `importlib.util.find_spec("vllm")` is None, so TRL's
`is_vllm_available()` is False and nothing of vLLM loads. SCRIPT runs as if started directly: its folder first on
`sys.path`, `sys.argv` = [SCRIPT, ARGS ...]. Works under `accelerate launch` (the launcher starts this file).
"""

import os
import runpy
import sys

sys.modules["vllm"] = None
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
runpy.run_path(script, run_name="__main__")
