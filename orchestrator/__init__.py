"""orchestrator: deploy LLM inference servers as systemd services and switch between them safely."""
