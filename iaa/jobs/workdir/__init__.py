"""The work folder: where things live, run folders, the output policy, safe names, and the paths
its records keep (relative to it, so a copied or moved folder works from its new place)."""
