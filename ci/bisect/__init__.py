"""python -m ci bisect: find the commit that broke an entry, honest about flaky ones."""
