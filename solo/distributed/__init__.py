"""Tensor parallelism over `torch.distributed`: dense models Megatron-style, lane models with DTP.

comm.py (timed collectives), sharding.py (what each rank holds), runtime.py (rank 0 drives, the others
follow), launch.py (`--tp N` spawns ranks, or joins a torchrun job), zygote.py (forks the spawned
ranks), bench.py (`solo bench --tp N`: time blocked on communication).
"""
