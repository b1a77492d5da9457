"""Page scripts (run by Streamlit by path, not imported)."""
