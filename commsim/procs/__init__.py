"""Process mode: every simulated rank a real OS process (docs/processes.md).

launcher.py spawns the ranks of a scenario and gathers their reports (`commsim run --procs`);
worker.py is a rank process's body; torchrun.py is the same body under torchrun; faults.py
the process-level faults (a rank killed at a step, a rank that never joins, one that stalls).
"""
