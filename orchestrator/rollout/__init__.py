"""Many deployments: a fleet rollout across a group's boxes, each switched by its own agent."""
