"""qrl-bench's Hydra plugins. Hydra instantiates launchers only from the `hydra_plugins` namespace package
(it scans it at start-up), so the launcher that conf/hydra/launcher/slurm.yaml names lives here; its code
is in bench/launch/launchers.py."""
