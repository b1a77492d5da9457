"""Datasets for training runs.

- :mod:`dyntool.data.sources`: where WikiText comes from (a folder of the tokenized text files, a
  folder of the hub's parquet files, or a hub id ``hf:Salesforce/wikitext[/CONFIG]`` read through
  the Hugging Face cache).
- :mod:`dyntool.data.wikitext`: word-level WikiText (the ``pytorch/examples``
  ``word_language_model`` convention: whitespace split, one ``<eos>`` per line,
  vocabulary of 33,278 types for WikiText-2), cached as memory-mapped int32 token ids, plus
  nanoGPT-style batching.
"""
