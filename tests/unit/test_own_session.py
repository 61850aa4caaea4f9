"""A private Ray instance's processes start out of the driver's process group, so a signal to
the group (GNU timeout, kill -TERM -PGID, scancel, a container stop) reaches the driver only;
this pins the Ray internals that relies on (a real run: tests/ray/test_group_sigterm.py)."""

from __future__ import annotations

import inspect
import os
import sys

from pipeline.data.connect import own_session


def test_processes_ray_spawns_while_a_private_instance_starts_get_their_own_session():
    from ray._private import services

    base = services.ConsolePopen
    with own_session() as applies:
        assert applies  # Linux: Ray fate-shares its processes with the driver via the kernel
        p = services.ConsolePopen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert os.getsid(p.pid) == p.pid != os.getsid(0)
        assert os.getpgid(p.pid) != os.getpgrp()
    finally:
        p.kill()
        p.wait()
    assert services.ConsolePopen is base  # only while the instance starts


def test_ray_still_spawns_its_processes_through_console_popen():
    """A Ray upgrade that spawns them another way would silently put them back in the
    driver's group: this names what moved."""
    from ray._private import services, utils

    assert "ConsolePopen(" in inspect.getsource(services.start_ray_process)
    assert "set_kill_on_parent_death_linux" in inspect.getsource(services.start_ray_process)
    assert callable(utils.detect_fate_sharing_support)
