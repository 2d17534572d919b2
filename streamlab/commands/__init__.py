"""The `streamlab` sub-commands, one module per family (lab, toxic, scenario, bench…)."""
