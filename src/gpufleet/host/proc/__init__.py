"""Processes on the host: /proc parsing, what a process is, and finding and killing GPU holders
as trees.
"""
