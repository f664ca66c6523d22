"""The agent that is shipped: the zip built from host/ (and sim/ for rehearsal hosts), the
bootstrap that runs it from memory, and the judge of the host interpreter root would run it
with; and `once`, which makes a per-process value the fan-out's threads ask for (the zip,
the bootstrap) by one thread only.
"""
