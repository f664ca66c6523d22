"""The host agent: runs on the GPU host with the host's own Python, answers JSON on stdout.

`main.py` dispatches a verb, `registry.py` maps each verb to its room (agent plumbing,
GPUs, processes, servers, bench) and `clean.py` is gpu-clean, which crosses them all.
Standard library only at import time (it runs in an SGLang virtualenv where gpufleet is not
installed); psutil and pynvml are imported inside the verbs that need them.
"""
