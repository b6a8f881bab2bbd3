"""Studies: a study file's arms x seeds as runs, each started by the launcher (`trl-ext launch`), and the report.

`spec` (the study file), `placement` (pure: GPU sets, cores, ports), `planning` (every run preflighted by the
launcher's `plan_launch`, placed on the node or planned for a Slurm task), `runner` (the runs on this machine:
process groups stopped by the launcher's routine, resume, failures, signals), `progress` (a run's state from its
folder and the status file its trainer writes), `slurm` (sbatch scripts with requeue and the time-limit warning, the
queue, cancel), `report` (statistics over seeds with scipy, curves, lengths, per arm), `claims` (published claims
judged from paired seeds, power by scipy), `cli` (`trl-ext study`). Above `launch`: a study starts runs only through
the launcher. docs/studies.md.
"""

from trl_ext.study.spec import DEFAULT_METRICS, Arm, Run, Study, StudyError, load_study

__all__ = ["DEFAULT_METRICS", "Arm", "Run", "Study", "StudyError", "load_study"]
