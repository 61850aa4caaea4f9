"""Ports for servers a test starts: distinct, so one server never gets one port twice."""

from __future__ import annotations

import socket

from tests.helpers import free_ports


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(64)
    assert len(set(ports)) == 64
    for port in ports[:8]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
