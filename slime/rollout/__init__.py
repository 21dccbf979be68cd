"""Rollout side: reward graders and the reference rollout/generate plugins."""
