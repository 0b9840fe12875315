"""Default settings of the embedded toy run (tuned to run on a laptop CPU)."""

TOY_HIDDEN_SIZE = 128
TOY_NUM_LAYERS = 4
TOY_NUM_HEADS = 4
TOY_SFT_STEPS = 100
TOY_SFT_LEARNING_RATE = 3e-3
TOY_SFT_BATCH_SIZE = 32
TOY_SFT_WARMUP_STEPS = 10
