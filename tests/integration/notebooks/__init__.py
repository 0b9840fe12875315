"""The notebooks under notebooks/, executed top to bottom in their fast mode."""
