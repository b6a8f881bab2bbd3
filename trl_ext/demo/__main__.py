"""`python -m trl_ext.demo [--flag value ...]`: run the embedded default."""

import sys

from trl_ext.recipes.vllm_import import skip_unused_vllm

skip_unused_vllm()  # the demo never uses vLLM: TRL's GRPO module then does not import it

from trl_ext.demo.run import main  # noqa: E402 - after the import decision above

sys.exit(main() and 0)
