"""Configs and presets (base): the job config and its YAML, the dataset presets, search spaces and what a sweep cannot tell."""
