"""The agent's plumbing, below every room of the host: the verb contract with the control
plane, the trust rule, the only way the agent writes a file, secrets redaction, the
allow-listed environment of every child, and process identity from /proc."""
