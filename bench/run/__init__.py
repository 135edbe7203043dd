"""A run's lifecycle: its identity (run path, name), its directory store, resume, preemption, time limit, tracking.

Imports nothing heavy at package level; the launch side reads run directories without loading torch.
"""
