from __future__ import annotations

import re
from pathlib import Path

import pytest

from streamlab.lab.nginx import TEMPLATE, NginxOptions, render, write_config
from streamlab.lab.topology import Ports


def test_rendered_config_has_no_placeholder_left(tmp_path: Path) -> None:
    path = write_config(Ports.load(), tmp_path, NginxOptions(read_timeout_s=7))
    text = path.read_text()
    assert "{{" not in text
    assert "proxy_read_timeout 7s;" in text
    assert f"listen {Ports.load().host}:{Ports.load().nginx_port} sndbuf=32k;" in text
    assert "send_timeout 30s;" in text  # the gateway's default send timeout


def test_missing_value_names_the_placeholder() -> None:
    with pytest.raises(KeyError, match="listen_port"):
        render("listen {{listen_port}};", {})


def test_fixed_location_disables_buffering_and_forwards_upgrades() -> None:
    text = TEMPLATE.read_text()
    fixed = re.search(r"location / \{(.*?)\}", text, re.S)
    assert fixed is not None
    for directive in ("proxy_buffering off;", "proxy_http_version 1.1;",
                      "proxy_set_header Upgrade $http_upgrade;"):
        assert directive in fixed.group(1)
