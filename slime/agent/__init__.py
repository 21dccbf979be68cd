"""The agent tier: provider-compatible adapters between an unmodified agent and the policy.

An agent written against the OpenAI or Anthropic SDK talks to an adapter
(`slime.agent.adapters`); the adapter turns each request into a token-level
`/generate` call on the rollout engine (`slime.agent.engine`), parses the output
back into the provider's shape (`slime.agent.parsing`) and records every turn in
a per-session tree (`slime.agent.trajectory`) that becomes training samples.
Agents run in a sandbox (`slime.agent.sandbox`); `slime.agent.rollout` ties an
episode together.
"""
