"""Putting the agent on a box: `orchestrator agent install` (wheels built here, shipped over SSH)."""
