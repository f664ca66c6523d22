"""The agent's plumbing: verb dispatch and registry, the contract with the control plane, the
trust rule, secrets redaction and the only way the agent writes a file.
"""
