"""The repository's scripts run as a user runs them: train.py, the README quickstart, benchmarks/, experiments/."""
