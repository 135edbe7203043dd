"""Registration shim: Hydra instantiates a sweeper `_target_` only under `hydra_plugins.`; the logic is in
bench/launch/sweeper.py (conf/hydra/sweeper/rows.yaml names this class)."""

from bench.launch import sweeper


class RowSweeper(sweeper.RowSweeper):
    """See bench.launch.sweeper.RowSweeper."""
