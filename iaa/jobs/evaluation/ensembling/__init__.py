"""Seed ensembles: members' predictions aligned by example and averaged, and the ensemble's
record on disk."""
