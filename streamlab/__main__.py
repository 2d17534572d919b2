# `python -m streamlab ...`: the CLI without the installed entry point (the images use it).
from streamlab.cli import main

main()
