"""The host agent: runs on the GPU host with the host's own Python, answers JSON on stdout.

Standard library only at import time (it runs in an SGLang virtualenv where gpufleet is not
installed); psutil and pynvml are imported inside the verbs that need them.
"""
