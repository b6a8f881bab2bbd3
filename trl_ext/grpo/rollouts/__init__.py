"""The generation side of the GRPO trainer: what shapes a generation batch before the loss sees it
(docs/architecture.md)."""
