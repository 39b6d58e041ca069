"""Datasets (base): preparing corpora, and resolving --dataset/--data to a prepared folder."""
