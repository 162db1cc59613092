"""The CLI's backends: the agent's socket, or in-process Operations."""
