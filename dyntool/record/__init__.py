"""Recording: names and dimensions (names), what/when to record (policy), the zarr store (store),
and the glue from a captured step to the store (recorder)."""
