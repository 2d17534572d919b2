"""Free ports for a whole lab beside the one that is up: the private labs of
the replica scenarios and the benches that start a lab of their own."""

from __future__ import annotations

import random

from streamlab.lab.local import Lab, LabOptions
from streamlab.lab.processes import StartError
from streamlab.lab.topology import Ports


def free_lab_ports(options: LabOptions) -> Ports:
    """Free ports whose replica ports (BASE + 1 per replica) are free too.
    Below the kernel's ephemeral range (32768 and up), so no client socket
    takes a replica's port before it binds. StartError when none are found."""
    names = [name for name in Ports.model_fields if name.endswith("_port")]
    for _ in range(20):
        bases = random.sample(range(20_000, 32_000, 2), len(names))
        ports = Ports.model_validate({"host": "127.0.0.1", "replica_port_step": 1,
                                      **dict(zip(names, bases, strict=True))})
        try:
            Lab(ports, options).check_ports_free()
        except StartError:
            continue
        return ports
    raise StartError("no free ports for a lab of its own (20 tries)")
