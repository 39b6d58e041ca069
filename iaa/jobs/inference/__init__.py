"""Use case: a trained reader at work (``iaa-cli predict`` and ``iaa-cli serve``)."""
