"""orchestrator: deploy vLLM model servers as systemd services and switch between them safely."""
