"""Reading the kernel's per-socket queues from a /proc/net/tcp listing."""

from __future__ import annotations

from streamlab.experiments import socket_queues

# A listener on 8471, nginx's accepted socket (8471 ← 40000) with 5,000 bytes
# unacknowledged, the edge's socket to nginx with 0x2000 bytes unread, and a
# socket in TIME_WAIT (06), which holds nothing any process can read.
LISTING = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:2117 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:2117 0100007F:9C40 01 00001388:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:9C40 0100007F:2117 01 00000000:00002000 00:00000000 00000000     0        0 3 1
   3: 0100007F:9C41 0100007F:2117 06 00000000:00000000 00:00000000 00000000     0        0 0 3
"""


def test_parses_established_sockets_with_their_queues() -> None:
    sockets = socket_queues.parse(LISTING)
    assert [(s.local, s.remote, s.tx, s.rx) for s in sockets] == [
        (("127.0.0.1", 8471), ("127.0.0.1", 40000), 5000, 0),
        (("127.0.0.1", 40000), ("127.0.0.1", 8471), 0, 0x2000),
    ]


def test_a_hop_holds_its_accepted_sockets_send_queues_and_its_dialled_receive_queues() -> None:
    sockets = socket_queues.parse(LISTING)
    assert socket_queues.held_by(sockets, listens_on=8471) == 5000  # nginx, towards the edge
    assert socket_queues.held_by(sockets, dials=8471) == 0x2000  # the edge, from nginx
    assert socket_queues.held_by(sockets, listens_on=9999, dials=9998) == 0
