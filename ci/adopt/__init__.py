"""Adoption by another repository: `switch` (`slime-ci adopt`), `import_workflow` (a
`pr-test.yml.j2` matrix into a registry) and `sessions` (the adopter's nox sessions)."""
