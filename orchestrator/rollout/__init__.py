"""Applications made of many deployments: a fleet rollout across a group's boxes (each switched by
its own agent) and tune (switch + bench per layout on one box)."""
