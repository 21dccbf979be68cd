"""Selection: which test files exist, what they declare, and which entries a run takes.

`discover` reads test files without importing them (NUM_GPUS, kind); `import_graph` is the
static import graph; `changed` finds what a branch touched; `entries` resolves a suite into
the ordered, sharded entries of one run; `audit` checks the registry against the files.
"""
