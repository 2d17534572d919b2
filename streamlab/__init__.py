"""streamlab: the lab's shared definitions (topology, Toxiproxy client) and its CLI.

`streamlab.api` holds the code generated from `protos/` (never edited by hand).
"""
