"""Servers on the host: detached launch, preflight, wait-ready, stop and logs, state files,
secret flags, the child environment and the HTTP health probe.
"""
