"""slime: the pure-logic core of an RL post-training framework, and a small training path."""
