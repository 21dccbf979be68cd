"""How good the tests are: mutation scores per core module (`mutation`, `mutation_targets`),
planted breaks each e2e entry must catch (`plants`), the page of every test file
(`files_page`)."""
