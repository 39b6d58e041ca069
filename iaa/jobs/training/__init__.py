"""Training one reader (base): the loop, one step, the session it runs in and its progress."""
