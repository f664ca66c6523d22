"""Servers on hosts: engine adapters (each engine's flags, words and metrics), profiles, the
launch/wait/stop/logs lifecycle and gpu-clean.
"""
