"""`python -m trl_ext.demo [--flag value ...]`: run the embedded default."""

import sys

from trl_ext.lazy import hide_vllm

hide_vllm()  # the demo never generates with vLLM: TRL's GRPO module then does not import it

from trl_ext.demo.run import main  # noqa: E402 - after vLLM is hidden

sys.exit(main() and 0)
