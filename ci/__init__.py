"""slime CI toolkit: declare tests once, then plan, run and report the same everywhere."""
