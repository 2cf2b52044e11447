"""The C kernels for a CPU and their choice: compiled for this machine on first use with the system C compiler
(`build`: `-O3 -march=native`, cached on disk, loaded through ctypes; None where no compiler is found or the build
fails), each C file (sharing `team.h`) wrapped by the module of the same name:

- `paged_decode`: decoding attention, one query per row, over the rows' blocks in place;
- `prefill_attention`: a prompt segment's whole attention in one call per layer (float32);
- `decode_layer`: a decoding step's whole layer in one call (txl.paged.fused_decode);
- `rows_linear`: a linear layer over up to 16 rows, reading its weight once;
- `plan_marks`: where a decoding step's rows put their new positions (txl.paged.decode_plan).

`linear` computes a linear layer through the kernel a decode path allows (torch's, oneDNN's or `rows_linear`),
measured fastest per shape on this machine where it allows several (`linear_choice`, remembered on disk);
`allocator` keeps freed memory in the C heap for CPU inference.
"""
