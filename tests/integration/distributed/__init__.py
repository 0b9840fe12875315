"""Multi-process runs (DDP, ZeRO-3, elastic resume, two nodes) and worker.py, grad_worker.py: the ranks they launch."""
