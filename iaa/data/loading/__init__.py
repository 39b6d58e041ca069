"""The torch side of a prepared folder: length-bucketed, padded batches, prefetched in a thread."""
