"""Processes on the host: what a process is (an engine's server, infrastructure), and
finding the ones that hold GPUs or look like stale servers, and killing them as trees;
on a Slurm node, the job step a process lives and ends in."""
