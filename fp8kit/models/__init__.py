"""A small Llama-style decoder trained in FP8 with fp8kit, in PyTorch and
in JAX: the same architecture, initial weights and arithmetic in both.

    config.py       LlamaConfig (frozen) and the named configs
    init.py         the initial weights (NumPy, from a seed) and rotary tables
    llama_torch.py  the model in PyTorch (FP8: fp8kit.torch.LayerNormLinear,
                    Linear and LayerNormMLP per layer)
    llama_jax.py    the model in JAX (FP8: fp8kit.jax.layernorm_dense, dense
                    and layernorm_mlp per layer)
    data.py         the corpus (Python's own library source), byte tokenizer, batches
    schedule.py     TrainConfig and the warmup + cosine learning rate
    checkpoint.py   one checkpoint file for both trainers, in init's layout,
                    checked on load (runs move between the frameworks)
    train_torch.py  TorchTrainer: AdamW, clipping, checkpoint and exact resume,
                    the decoder optionally under torch.compile
    train_jax.py    JaxTrainer: the same, one jit-compiled step
    bench.py        python -m fp8kit.models.bench: tokens/s and peak memory per step
    bench_peers.py  the benchmark's peers: TransformerEngine's layers, torchao's
    moe_te.py       the MoE block with TransformerEngine's GroupedLinear experts
    cli_support.py  what the command lines check before they start (arguments,
                    outputs, packages, a CPU run's estimated time)
"""
