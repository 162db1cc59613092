"""`ray start` as a multi-node model's Ray units run it (pure): the one place its options are named, for
core/multinode.py, which renders them, and the catalog, which refuses a model's ``ray_args`` that repeat
one (`ray start`, a click command, takes the last of a repeated option: the node would leave what the
switch renders and waits on: the head's port, the node's address, its GPUs)."""

from __future__ import annotations

from orchestrator.errors import RenderError

RAY_DIR = "/var/lib/ray"  # the Ray units' StateDirectory=ray

# Every option the Ray units write from the model's or its host's keys, with where its value comes from.
FROM_KEYS = {
    "--head": "the model's first node",
    "--address": "the first node's address and ray_port",
    "--port": "the model's `ray_port`",
    "--node-ip-address": "the host's node_address",
    "--num-gpus": "the model's `gpus`",
    "--temp-dir": "the unit's state directory",
    "--block": "the unit (it runs in the foreground)",
}
# The options they write whatever the model says, with why.
FIXED = {
    "--disable-usage-stats": "no usage reports leave the box",
    "--include-dashboard": "no dashboard on the head (`ray status`, what the switch waits on, reads the GCS "
    "directly) and Ray refuses the option on workers",
}
RENDERED = {**FROM_KEYS, **FIXED}


def _option(flag: str, *value: str) -> list[str]:
    if flag not in RENDERED:  # what the units render is what ray_args may not repeat: one table
        raise RenderError(f"`ray start {flag}` is rendered but not named in core/ray_start.py RENDERED")
    return [flag, *value]


def start_argv(
    ray: str, *, head: bool, head_address: str, ray_port: int, node_address: str, gpus: int, ray_args: tuple[str, ...]
) -> list[str]:
    """A Ray node's command line: the head's (``head``) or a worker's, then the model's ``ray_args``.
    Session files and sockets go under the unit's StateDirectory (Ray's default /tmp/ray would be
    invisible to the engine unit, which has PrivateTmp=yes)."""
    common = [
        *_option("--block"),
        *_option("--node-ip-address", node_address),
        *_option("--num-gpus", str(gpus)),
        *_option("--temp-dir", RAY_DIR),
        *_option("--disable-usage-stats"),
    ]
    if head:
        # No dashboard: it is a job-submission endpoint nobody here uses, and memory.
        argv = [
            ray,
            "start",
            *_option("--head"),
            *_option("--port", str(ray_port)),
            *common,
            *_option("--include-dashboard", "false"),
        ]
    else:
        argv = [ray, "start", *_option("--address", f"{head_address}:{ray_port}"), *common]
    return [*argv, *ray_args]
