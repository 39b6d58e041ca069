"""Use case: distil an ensemble into one reader (``iaa-cli distill``), and the teacher files it learns from."""
