"""`python -m txl_server check`: the configured model on the configured device, checked and measured through the
server's own worker (`command`), and the figures the benchmarks share with it.

command: the arguments and the run; parity: the engine against the reference, and a seeded generation twice;
speed: decoding and scoring against the floor; floor: the memory-bandwidth floor of a decoding step (`bench`
measures against it too); report: the lines printed; gpu_section: the GPU section of docs/benchmarks.md, written
through benchmark_docs (the Markdown sections every `bench` suite writes).
"""
