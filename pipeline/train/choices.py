"""The trainer's named choices, without importing torch (the pre-flight check reads them)."""

__all__ = ["KL_LOSS_TYPES", "LOSS_AGG_MODES", "LR_DECAY_STYLES"]

# slime's --kl-loss-type (low_var_kl: k3 clamped to [-10, 10])
KL_LOSS_TYPES = ("k1", "k2", "k3", "low_var_kl")
# how per-token losses become one number (pipeline/train/losses.py has the table)
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# Megatron's --lr-decay-style choices we implement
LR_DECAY_STYLES = ("constant", "linear", "cosine")
