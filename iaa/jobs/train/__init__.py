"""Use case: train one reader (``iaa-cli train``) and time its steps (``iaa-cli bench``)."""
