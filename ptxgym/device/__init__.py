"""The machine's GPUs: ``gpus`` (finding them through NVML, CUDA contexts, the driver),
``lock`` (the machine-wide GPU lock under which timings never overlap, across processes) and
``occupancy`` (how that lock was held over time, for the throughput benchmark)."""
