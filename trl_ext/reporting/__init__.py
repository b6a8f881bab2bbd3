"""What trl_ext's reports draw from: a training run's logs, the figures, and `trl-ext plot`.

- `run_logs`: a run folder's `trainer_state.json` history, the logged metric behind each panel, and every entry's
  position on each x-axis (optimizer step, GRPO step, validation step, the rebuilt wall clock);
- `figures`: matplotlib on its file-only backend, a figure written and let go in one place;
- `plot`: `trl-ext plot` (training curves of several runs, pass@N / Best@N of an evaluation).

The study report (`trl_ext.study.report`) and the demo's report (`trl_ext.demo.report`) draw with the same pieces.
Light to import: matplotlib loads on the first figure.
"""
