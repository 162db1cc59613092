"""The agent's read-only web dashboard (issue 27): pages on a Unix socket, forwarded by `orchestrator dashboard`."""
