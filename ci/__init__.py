"""slime CI toolkit: declare tests once, plan, run, report — the same on a laptop, a GPU box and in Actions."""
