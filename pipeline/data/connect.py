"""Which Ray cluster a process starts or joins: one rule for every entry point.

`ray.init(address=None)` -- also what Ray Data does when it starts Ray by itself -- first reads
RAY_ADDRESS, then the address file a `ray start` left on the machine, and joins that cluster:
someone else's, or a dead one, which it retries for minutes without a word. So every entry point
(`jobs.train`, `jobs.plan_buckets`, `jobs.tokenize`, `jobs.bench_data`, the own-loop API, the
length index) goes through `connect`: the address it is given, else RAY_ADDRESS (what
`ray job submit` sets), else a private local instance; "auto" joins the cluster `ray start` left
on this machine; a named address that does not answer fails in seconds, in one line. A private
instance that does not come up (Ray waits 30 s for its processes, too little on a machine
under load) ends in one line saying what to do (`RayStartError`), not Ray's traceback.

A private instance's processes (GCS, raylet, dashboard agent, and through the raylet every
worker) start in a session of their own (`own_session`). Ray starts them in the driver's process
group, so a signal to the whole group -- GNU `timeout`, `kill -TERM -PGID`, Slurm's `scancel`, a
container stop -- killed the GCS under a driver still stopping the run gracefully. Out of the
group, only the driver gets the signal and stops the run as after a SIGTERM of its own; the
processes still die with the driver (Ray's kernel fate-sharing, PR_SET_PDEATHSIG, where the
kernel offers it; elsewhere they stay in the group, where Ray's reaper cleans them up).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext

from pipeline.core.config import ConfigError

__all__ = [
    "CONNECT_TIMEOUT_S",
    "RayStartError",
    "check_reachable",
    "connect",
    "on_this_node",
    "own_session",
    "resolve_address",
]

# How long a given Ray address may take to answer before the process gives up.
CONNECT_TIMEOUT_S = 15.0
_NEW_INSTANCE_ONLY = ("num_cpus", "num_gpus", "resources", "object_store_memory", "labels")
# What Ray 2.60 says when a private instance's processes do not come up in time
# (ray/_private/node.py waits a fixed 30 s for the raylet to register) or fail to start.
_START_FAILURES = ("timed out during startup", "failed to start")


class RayStartError(ConfigError):
    """A private local Ray instance did not start. Not a config problem, but like one it ends
    the run in one line with what to do (the CLIs print ConfigError lines, exit 2)."""

    retryable = False


def resolve_address(flag: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """`ray.init`'s address: the --address flag, else RAY_ADDRESS (what `ray job submit` sets
    for its entrypoint), else "local" -- a private instance. Never None, which would join
    whatever cluster the machine's Ray state file names, possibly a dead one."""
    if flag:
        return flag
    return environ.get("RAY_ADDRESS") or "local"


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a GCS or Ray Client address, None for anything else."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def check_reachable(address: str, timeout_s: float) -> None:
    """Raise ConfigError (one line) when nothing answers at `address` within `timeout_s`;
    `ray.init` would otherwise retry a dead address for minutes without a word."""
    hp = _host_port(address)
    if hp is None:
        raise ConfigError(
            f"Ray address {address!r} is not host:port (or ray://host:port); pass --address "
            "auto to join the cluster `ray start` left on this machine"
        )
    try:
        socket.create_connection(hp, timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(
            f"no Ray cluster answers at {address} ({e.strerror or e}; waited up to "
            f"{timeout_s:.0f} s): start it, fix --address / RAY_ADDRESS, or unset both to "
            "run on a private local Ray instance"
        ) from None


def connect(
    address: str | None = None, *, timeout_s: float = CONNECT_TIMEOUT_S, **init_kwargs
) -> tuple[bool, object | None]:
    """Start or join Ray by the rule above, unless it is up already. Returns (joined a running
    cluster, ray.init's context or None when Ray was up). `init_kwargs` go to `ray.init`
    (a private instance's `num_cpus`, `logging_level`, ...)."""
    import ray

    if ray.is_initialized():
        return False, None
    target = resolve_address(address)
    if target == "auto":
        from ray._private.services import get_ray_address_from_environment

        try:
            target = get_ray_address_from_environment("auto", None)
        except ConnectionError:
            raise ConfigError(
                "--address auto: no Ray cluster started by `ray start` on this machine; start "
                "one, pass its host:port, or leave --address out to run on local Ray"
            ) from None
    if target != "local":
        check_reachable(target, timeout_s)
        # What only a new instance can be given (ray.init refuses it when joining).
        init_kwargs = {k: v for k, v in init_kwargs.items() if k not in _NEW_INSTANCE_ONLY}
    try:
        with own_session() if target == "local" else nullcontext():
            ctx = ray.init(address=target, **init_kwargs)
    except Exception as e:
        text = " ".join(str(e).split())
        if target != "local" or not any(f in text.lower() for f in _START_FAILURES):
            raise
        ray.shutdown()  # what half started is stopped
        raise RayStartError(
            f"local Ray did not start ({text}): the machine is likely too busy to start Ray's "
            "processes in Ray's 30 s; run again when the load is lower, or start Ray yourself "
            "with `ray start --head` (it waits as long as it needs) and pass --address auto"
        ) from None
    return target != "local", ctx


@contextmanager
def own_session() -> Iterator[bool]:
    """While a private instance starts, every process Ray spawns (`services.start_ray_process`,
    through `services.ConsolePopen`) starts a session of its own, out of the driver's process
    group (module docstring). Yields whether it applies: only where Ray fate-shares its
    processes with the driver through the kernel, so they never outlive it."""
    from ray._private import services, utils

    base = services.ConsolePopen
    if os.name != "posix" or not utils.detect_fate_sharing_support():
        yield False
        return

    class OwnSessionPopen(base):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSessionPopen
    try:
        yield True
    finally:
        services.ConsolePopen = base


def on_this_node():
    """The scheduling strategy that pins an actor to this process's node (the driver's): the
    run's small zero-CPU actors (the feeder, its index holder, the stop flag) would otherwise
    be placed on any node, and a lost worker node would take them with it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
