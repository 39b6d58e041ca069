"""The reader as the jobs handle it (base): the checkpoint format, the training objective and the precision policy."""
