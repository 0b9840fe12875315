"""Fast in-process tests of one module or a small group of them, named after the module they test."""
