"""Tests that run the trainer end to end, several processes, the repository's scripts or its notebooks."""
