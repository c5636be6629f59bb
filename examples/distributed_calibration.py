"""Calibrate on several processes or machines, each on its own shard of the data, and get exactly
the INT8 model one process would get from all of it.

    torchrun --standalone --nproc_per_node 2 examples/distributed_calibration.py
    # across machines, on each of N hosts (K = 0 .. N-1):
    torchrun --nnodes N --node_rank K --master_addr HOST0 --master_port 29500 --nproc_per_node 1 \
        examples/distributed_calibration.py

Every rank prepares the same FP32 model, calibrates on its shard, then calls
qbackend.reduce_calibration, a collective over the gloo process group that merges every
calibration statistic (activation ranges, SmoothQuant's channel statistics, GPTQ's Hessians);
convert then gives the same model on every rank. A rank that dies, hangs, or prepared another
model or config is named in the error the others raise.

The model is the small CNN of qbackend.models.digits, trained on scikit-learn's bundled digits.
"""
import torch
import torch.distributed as dist

import qbackend
from qbackend.models.digits import top1_percent, train_digits_cnn

dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()

# The same FP32 weights on every rank (in practice each rank loads the same checkpoint; here rank
# 0's trained weights are broadcast).
model, split, _ = train_digits_cnn()
with torch.no_grad():
    for t in model.state_dict().values():
        dist.broadcast(t, src=0)

# This rank's shard of the calibration batches (shards may be uneven, or empty).
batches = [split.x_calib[i:i + 32] for i in range(0, len(split.x_calib), 32)]
shard = batches[rank::world]

prepared = qbackend.prepare(model, (batches[0],))
qbackend.calibrate(prepared, shard)
report = qbackend.reduce_calibration(prepared)  # every rank now holds all the shards' statistics
qmodel = qbackend.convert(prepared)

if rank == 0:
    fp32 = top1_percent(model, split.x_test, split.y_test)
    int8 = top1_percent(qmodel, split.x_test, split.y_test)
    print(f"{world} ranks, {len(batches)} calibration batches ({len(shard)} on rank 0); reduced "
          f"{report.statistics} statistics in {report.seconds:.2f} s, {report.bytes_gathered} bytes gathered, "
          f"{report.bytes_summed} bytes summed")
    print(f"test top-1: FP32 {fp32:.2f}%, INT8 {int8:.2f}%")
dist.destroy_process_group()
