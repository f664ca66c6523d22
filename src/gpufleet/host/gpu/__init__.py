"""GPUs on the host: NVML (real or simulated), the health gate, and the gpu-clean and status
verbs.
"""
