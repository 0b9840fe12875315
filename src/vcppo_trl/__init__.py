"""VC-PPO for TRL."""
