"""Registration shims: Hydra accepts a launcher `_target_` only under `hydra_plugins.`; the logic is in
bench/launchers.py (conf/hydra/launcher/local.yaml and slurm.yaml name these classes)."""

from bench import launchers


class SnapshotJoblibLauncher(launchers.SnapshotJoblibLauncher):
    """See bench.launchers.SnapshotJoblibLauncher."""


class SnapshotSlurmLauncher(launchers.SnapshotSlurmLauncher):
    """See bench.launchers.SnapshotSlurmLauncher."""
