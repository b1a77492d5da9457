"""The dyntool Streamlit app (``dyntool app RUNS_DIR``).

``main.py`` is the entry point; it registers this directory as the package ``dyntool_app`` (so
the pages import ``from dyntool_app import data, plots, ui`` without clashing with any other
top-level ``app``) and builds the navigation over ``views/*.py``.

Modules: ``data`` (cached, marker-bounded reads), ``analysis`` (PCA and other derived numbers),
``plots`` (plotly builders), ``export`` (publication-figure downloads), ``ui`` (shared widgets).
"""
