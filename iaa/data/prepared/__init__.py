"""A prepared folder: built from parsed examples (Parquet shards, the vocabulary, the manifest)
and checked before a job reads it."""
