"""Sweeps: the cells a grid expands to, their resumable state and the experiment that runs them
in order.
"""
