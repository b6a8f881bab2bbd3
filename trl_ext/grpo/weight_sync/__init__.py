"""The trainer's weights into vLLM where TRL's own sync cannot reach: a colocated engine on vLLM's CPU backend, and a
vLLM server from a trainer without CUDA (its wire and the vLLM worker's side; the trainer's side is
`trl_ext.grpo.vllm.client`). docs/architecture.md. Light to import: vLLM loads its plugin from here."""
