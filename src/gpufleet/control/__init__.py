"""The control plane, on the user's machine, in rooms by job: `connect/` reaches hosts,
`agent/` ships the agent, `inventory/` says which hosts, `server/` runs servers on them,
`bench/`, `sweep/` and `tune/` measure them. No printing: tasks print what it returns."""
