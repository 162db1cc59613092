"""The operation contract shared by the CLI's backends, the agent and the fleet fan-out.

``ops`` declares each operation once (arguments in ``args``, result, who may run it, how it runs);
``wire`` is its encoding on the agent's socket (requests, replies, error types, the socket path).
It sits below client/, agent/ and rollout/ and imports none of them.
"""
