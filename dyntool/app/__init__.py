"""The dyntool Streamlit app (``dyntool app RUNS_DIR``), shipped inside the package.

``main.py`` is the entry point (``streamlit run`` executes it as a script); it builds the
navigation over the page scripts in ``views/``, which import ``from dyntool.app import ...``.

Modules: ``data`` (cached, marker-bounded reads through :mod:`dyntool.run`), ``analysis`` (PCA and
other derived numbers), ``plots`` (plotly builders), ``export`` (downloads through
:mod:`dyntool.figures`), ``ui`` (shared widgets).  Importing this package imports no Streamlit.
"""
