"""Benchmarks: the request, the run (plan, start, attach, archive), find-max, prompt sets and
workloads.
"""
