"""The Triton kernels of a decoding step on a GPU (on a CPU only under Triton's interpreter, for tests); `common` is
what they share (whether Triton runs on a device, the launch, the SM count, the semaphores).

- `decode`: decoding attention of the layer-by-layer path (split along the memory, partitions combined);
- `attention`, `rows_linear` (with `layer_norm`): the fused decoding body of txl.paged.gpu_decode, five launches
  per layer;
- `embedding`, `softmax`: the adaptive embedding and log-softmax;
- `sampling`: temperature, top-k, top-p and the draw, in a fixed few launches.

Each is checked against the torch path it replaces (tests/model, under the interpreter), and compiled ahead of
time for a GPU with no GPU present by `bench/triton_report.py`.
"""
