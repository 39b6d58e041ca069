"""``python -m iaa.cli``: the same as ``iaa-cli``."""

from iaa.cli.group import main

main()
