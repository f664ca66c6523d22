"""The host agent: runs on the GPU host with the host's own Python, answers JSON on stdout.

`dispatch.py` dispatches a verb, `registry.py` maps each verb to its room (agent plumbing,
GPUs, processes, servers, bench) and `clean.py` is gpu-clean, which crosses them all.
Standard library only: processes are read from /proc (host/proc/procfs.py), not psutil;
pynvml is imported inside the verbs that need NVML.
"""
