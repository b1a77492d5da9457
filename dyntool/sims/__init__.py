"""Simulations: the sticky Markov-chain study data, the toy task, and the batched single-head engine."""
