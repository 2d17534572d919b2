"""streamlab: the lab tool. It brings the topology up, toggles faults, runs
scenarios, soaks and benchmarks. The top layer: it may import the services and
`streamlab_protocol`; nothing under `services/` imports it.
"""
