"""The test suite's two stages. `bash scripts/test.sh` (the README's command) runs the first: every test not marked
`slow`. The second, `pytest -m slow` (`TXL_TEST_STAGE=slow bash scripts/test.sh`), holds the tests that take a
minute or more on a 2-core machine; `.ci/run` runs both. Nothing is dropped: CI runs every test.

Marked `slow` in their own files: the reliability suite's load, faults, leaks and schemathesis runs, the replica
tests, the Docker image, nginx and image-emulation tests. Marked here (conftest.py applies the mark), each with
what it takes, and what the first stage still covers of the same code:
"""

from __future__ import annotations

SECOND_STAGE: dict[str, str] = {
    # Triton's interpreter runs the GPU kernels on the CPU, thousands of times slower than compiled; the first
    # stage still checks the kernels' launch rules, the torch paths they are compared with, and the static buffers.
    "tests/server/engine/test_selfcheck.py::test_the_switches_in_every_combination_serve_the_same_tokens": (
        "four workers started with Triton under its interpreter"
    ),
    "tests/model/test_triton_decode.py::test_triton_decode_kernel_equals_the_torch_path_under_the_interpreter": (
        "the decode kernel under Triton's interpreter"
    ),
    "tests/model/test_triton_decode.py::test_triton_decode_kernel_meets_its_contract_on_random_rows": (
        "the decode kernel under Triton's interpreter, on random rows"
    ),
    "tests/model/test_triton_sampling.py::test_the_triton_sampler_keeps_what_a_full_sort_keeps_and_draws_the_torch_paths_tokens": (
        "the sampling kernel under Triton's interpreter"
    ),
    "tests/server/engine/test_graphs.py::test_static_decode_buffers_with_the_triton_kernel_give_the_eager_results": (
        "the static decode buffers with the Triton kernel under its interpreter"
    ),
    # The C kernels built a second time, for AVX2 alone; the first stage tests them as this CPU builds them.
    "tests/model/test_prefill_attention.py::test_the_kernels_built_for_avx2_alone_meet_the_same_contracts": (
        "builds the C kernels again, for AVX2 alone"
    ),
    # Sizes users meet, which take long on a CPU; the first stage runs the same paths on smaller inputs.
    "tests/clients/test_long_work.py::test_a_1_mib_append_with_the_default_settings_succeeds": (
        "a 1 MiB append through the SDK"
    ),
    "tests/model/test_default_model.py::test_held_out_slice_scores_within_0_05_of_the_model_card": (
        "scores the held-out slices with the bundled model"
    ),
    "tests/server/test_resident_memory.py::test_the_bundled_model_serves_three_sessions_and_a_30_kb_score_in_under_1_gib": (
        "the bundled model scores 30 kB in a server process"
    ),
    "tests/server/engine/test_batching.py::test_no_block_leaks_after_a_thousand_sessions_come_and_go": (
        "a thousand sessions"
    ),
    # The block sweeper as it runs, on its own clock (15 s sweeps, 40 s grace); tests/server/sessions/
    # test_block_sweeper.py checks the same rules at once, with aged files.
    "tests/server/sessions/test_sessions_at_rest.py::test_a_deleted_sessions_blocks_leave_the_store_within_a_minute": (
        "waits up to a minute for the sweeper"
    ),
    # Server processes restarted many times; the first stage restarts the default mode (persistence always).
    "tests/server/sessions/test_restart.py::test_every_listed_session_steps_after_a_graceful_restart_and_a_kill[evict]": (
        "three server starts, persistence evict"
    ),
    "tests/server/sessions/test_restart.py::test_every_listed_session_steps_after_a_graceful_restart_and_a_kill[none]": (
        "three server starts, persistence none"
    ),
    # Installs into fresh virtual environments; the first stage checks the install script's choices and messages.
    "tests/scripts/test_install.py::test_pip_quietly_keeps_the_editable_installation_warnings_out": (
        "a fresh virtual environment and two editable installs"
    ),
    # The HF reference imported and a checkpoint converted by the CLI; tests/clients/test_convert* and the parity
    # tests keep the conversion and the reference in the first stage.
    "tests/clients/test_cli.py::test_convert_an_hf_transfo_xl_directory": "transformers imported, a conversion",
    # The server as the README starts it (serve.sh, the bundled model) and every page's samples against it; the
    # first stage runs the API's and the clients' pages against a tiny model (test_the_samples_of_a_page_run_...).
    "tests/docs/test_doc_samples.py::test_every_sample_runs_against_the_server_the_readme_starts": (
        "starts the README's server on the bundled model and runs every page's samples"
    ),
}


def stage_of(nodeid: str) -> str | None:
    """Why `nodeid` runs in the second stage, if it is listed here (a parametrised test by its name or one case)."""
    return SECOND_STAGE.get(nodeid) or SECOND_STAGE.get(nodeid.split("[", 1)[0])
