"""results/README.md from the raw JSON of a run: loading, one module per section, the page."""
