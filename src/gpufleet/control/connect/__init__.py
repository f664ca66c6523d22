"""The ways to reach a host: one module per connector (local, ssh, srun) with its session,
agent process and file tree, the base protocol they share, the session pool a task opens
once, and the bounded fan-out over hosts.
"""
