"""What a sweep shares with the jobs that read it (base): its record on disk, its cost and its console."""
