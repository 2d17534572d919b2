"""The one build step pyproject.toml cannot say: the lab's files that live
outside the package in the repository (lab.env at the root, the edge proxies'
config templates and the Toxiproxy patch under proxies/) are copied into the
wheel as package data, under streamlab/_data/ at their repository paths.
streamlab/paths.py reads them there (`data_file`), or, run from a clone, where
they are. MANIFEST.in puts the same files in the sdist, so a wheel built from
the sdist carries them too. An editable install copies nothing: it runs from
the clone, whose own files it reads.
"""

from __future__ import annotations

from glob import glob
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# Repository paths (globs) of the files the installed lab needs.
LAB_DATA = (
    "lab.env",
    "proxies/*/*.template",
    "proxies/toxiproxy/patches/*",
    "proxies/jaeger/*.yaml",
)
PACKAGED = Path("streamlab") / "_data"  # streamlab/paths.py's PACKAGED


def lab_data_files(root: Path = Path(".")) -> list[str]:
    """Every file LAB_DATA names, as repository paths, sorted."""
    found = {str(Path(path).relative_to(root)) for pattern in LAB_DATA
             for path in glob(str(root / pattern)) if Path(path).is_file()}
    return sorted(found)


class BuildPyWithLabData(build_py):
    """build_py, then the lab's files into the build's streamlab/_data/."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        files = lab_data_files()
        if "lab.env" not in files:
            raise SystemExit("lab.env is missing: build from the repository or its sdist")
        for relative in files:
            target = Path(self.build_lib) / PACKAGED / relative
            self.mkpath(str(target.parent))
            self.copy_file(relative, str(target))


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPyWithLabData})
