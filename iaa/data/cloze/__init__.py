"""Cloze datasets made from any text, in the official CBT and CNN file formats.

The pipeline is: read documents (:mod:`.sources`), cut them into work units and tag the
units' words with parts of speech and named entities (:mod:`.tagging`, spaCy imported lazily),
cut questions with a recipe (:mod:`.cbt_recipe` after Hill et al. 2016, :mod:`.cnn_recipe`
after Hermann et al. 2015), assign documents to splits (:mod:`.splits`) and write the files
that ``iaa-cli prepare`` reads (:mod:`.writers`). Tagging is the only costly step; the job
runs it in this process or on Ray, and everything after it is deterministic given the seed.
"""
