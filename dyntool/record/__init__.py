"""Recording: names and dimensions (names, metric_names), what/when to record (policy), the zarr
store's writer (store_writer) and marker-bounded reader (store), and the glue from a captured step
to the store (recorder)."""
