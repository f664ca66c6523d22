"""inv tune: the depth table chosen from measurements, the budget, the verification, the mend
of a level below the goal, the load step and bursts, the files written, and the one-depth
tune of engines without an adaptive table.
"""
