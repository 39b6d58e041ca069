"""The work folder: where things live, run folders, the output policy and safe names."""
