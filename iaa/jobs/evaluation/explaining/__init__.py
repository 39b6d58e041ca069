"""``iaa-cli explain``: a reader's attention step by step on chosen examples, its records, and
the HTML page and Figure-2-style plot made of them."""
