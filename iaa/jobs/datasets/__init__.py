"""Data a reader can train on: prepared corpora, cloze questions from any text, and resolving --dataset/--data."""
