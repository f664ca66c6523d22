"""Rehearsal engine: the parts of a GPU host a CPU machine lacks (NVML, the SGLang server).

Users run it too (`hosts/rehearsal.yaml`), so every task works end to end without GPUs.
Standard library only at import time: it ships inside the host agent's zipapp.
"""
