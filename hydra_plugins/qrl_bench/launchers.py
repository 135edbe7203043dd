"""Registration shims: Hydra accepts a launcher `_target_` only under `hydra_plugins.`; the logic is in
bench/launch/launchers.py (conf/hydra/launcher/local.yaml and slurm.yaml name these classes)."""

from bench.launch import launchers


class SnapshotLocalLauncher(launchers.SnapshotLocalLauncher):
    """See bench.launch.launchers.SnapshotLocalLauncher."""


class SnapshotSlurmLauncher(launchers.SnapshotSlurmLauncher):
    """See bench.launch.launchers.SnapshotSlurmLauncher."""
