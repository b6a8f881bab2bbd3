"""The integration with vLLM, through TRL's generation classes: what changes where a trainer meets the engine.

- `generation`: `TrlExtVLLMGeneration`, TRL's `VLLMGeneration` subclassed (the engine's start, the weight sync,
  `generate` with vLLM's finish reasons, the watchdog), `vllm_generation_class` (the one swap: TRL's trainers build
  it by the name `VLLMGeneration`) and `install_generation` (a trainer's generation tied to its steps);
- `client`: `TrlExtVLLMClient`, TRL's `VLLMClient` subclassed (the gloo weight sync off CUDA, the replay of async
  rollouts, finish reasons, the watchdog around requests);
- `replay` (async rollouts' request sent ahead and its replay), `finish_reasons` (vLLM's word on each completion),
  `watchdog` (a stalled server ends the run, saying where), `cpu_sampler` (the eager sampler wherever trl_ext starts
  vLLM's CPU engine: the colocated engine, the launcher's server, the evaluation's backend).

Used by the GRPO trainer, the expert-iteration trainer and SFT validation alike. Light to import: `cpu_sampler` is
standard library only; the other modules load TRL's generation classes (and with them vLLM).
"""
