"""Switch downtime benchmark: the orchestrator against an Ansible playbook and a bash script."""
