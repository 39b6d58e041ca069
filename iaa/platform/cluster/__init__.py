"""Joining or starting Ray, sizing trials on it, and storage every node sees."""
