"""inv tune: the depth table chosen from measurements, the budget, the load step and bursts,
the verification, the files written, and the one-depth tune of engines without an adaptive
table.
"""
