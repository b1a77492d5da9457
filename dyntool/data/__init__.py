"""Datasets for training runs.

- :mod:`dyntool.data.wikitext`: word-level WikiText-2 (the ``pytorch/examples``
  ``word_language_model`` convention: whitespace split, one ``<eos>`` per line,
  vocabulary of 33,278 types), cached as int32 token ids, plus nanoGPT-style batching.
"""
