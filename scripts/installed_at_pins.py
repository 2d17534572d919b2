"""Exit 0 when every `name==version` given is installed at that version, 1
otherwise: the install scripts' "nothing to do" test, so a second run asks no
index (scripts/install_check_servers.sh, scripts/install_llama_server.sh)."""

import sys
from importlib.metadata import PackageNotFoundError, version


def main(pins: list[str]) -> int:
    try:
        return int(any(version(n) != v for n, _, v in (p.partition("==") for p in pins)))
    except PackageNotFoundError:
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
