"""The model tests' decoder: small, but with every feature (two layers,
grouped-query attention); an FP8 training step takes well under a second
on the CPU."""

from fp8kit.models.config import LlamaConfig
from fp8kit.models.schedule import TrainConfig

SMALL = LlamaConfig(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, seq_len=32)
SMALL_TRAIN = TrainConfig(steps=8, batch=2, lr=3e-3, warmup_steps=2)
