"""``python -m iaa``: the same as ``iaa-cli``."""

from iaa.cli.group import main

main()
