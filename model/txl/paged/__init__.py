"""Paged memory and the machinery of one inference step over it (how the model serves; not in the paper).

- `layout`: the shapes and placement every memory of one model shares (`MemoryLayout`).
- `pool`: the block pool: fixed-size blocks of keys and values for every layer, reference counted, written
  append-only, handed out and reserved (`BlockPool`, `BlockTable`, `Reservation`).
- `rows`: one sequence's memory as a row of the pool (`PagedRow`), and how a step makes room after it (`plan_row`).
- `step`: one forward over many rows, planned once for every layer (`PagedStep`), or a decoding step whose inputs
  live in buffers that never move, for CUDA graphs (`StaticDecodeStep`).
- `decode_plan`: a decoding step's rows planned together, with array operations (`plan_decode`).
- `staging`: a step's small inputs sent from the host to the device in one copy.
- `layer_weights`: what a fused decoding step reads of a decoder layer, by name (`LayerWeights`).
- `fused_decode`: a decoding step on the CPU through one native call per layer.
- `gpu_decode`: a decoding step on a GPU through five Triton launches per layer.
"""
