"""Use case: cloze questions from the user's own text (``iaa-cli make-cloze``)."""
