"""Which hosts a task acts on: the inventory model, where it is read from (files, programs,
Slurm jobs and partitions), Slurm host lists and the strict YAML reader every config file
goes through.
"""
