"""Seed ensembles and distillation: members, averaged distributions, teachers."""
