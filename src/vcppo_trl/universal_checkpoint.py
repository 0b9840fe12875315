"""`python -m vcppo_trl.universal_checkpoint CHECKPOINT`: convert a ZeRO-3 checkpoint to DeepSpeed's universal form
(see `checkpoint/universal.py`, where the conversion lives)."""

from .checkpoint.universal import main

if __name__ == "__main__":
    main()
