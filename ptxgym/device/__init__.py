"""The machine's GPUs: ``gpus`` (finding them through NVML, CUDA contexts, the driver) and
``lock`` (the machine-wide GPU lock under which timings never overlap, across processes)."""
