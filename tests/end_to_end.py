"""The end-to-end tests the default set (`make test`, `pytest -m "not slow"`) keeps on purpose.

Every other test that starts a subprocess or runs the training loop is marked `slow` and runs only
in `make test-all`; tests/conftest.py fails a test that does either without being marked or listed
here. These few keep one path of each command line in the fast set, so a change that breaks
`train.py`, a resume, `sample.py`, `sweep.py`, `python -m transformer.explore` or a notebook is
seen in minutes.
"""

KEPT = {
    "tests/test_train_cli.py::test_resume_is_exact[adamw]": "train.py trains, stops and resumes, bitwise",
    "tests/test_sample_cli.py::test_greedy_from_a_prompt_file_past_the_context_is_the_argmax_decode":
        "sample.py samples a run's checkpoint (greedy, from a prompt file)",
    "tests/test_sweep.py::test_the_table_has_every_run_and_the_figure_is_written":
        "a sweep trains its variants (in this process) and writes its table and figure",
    "tests/test_sweep.py::test_the_command_line_reports_a_bad_sweep_file_in_one_line_and_exits_2":
        "sweep.py's command line",
    "tests/test_explore.py::test_command_line_writes_a_page_from_a_hugging_face_folder":
        "python -m transformer.explore writes a page",
    "tests/test_explore_browser.py::test_the_page_in_chromium": "the explorer's page in a real browser",
    "tests/test_layering.py::test_importing_a_module_loads_only_what_it_imports":
        "importing a module in a fresh interpreter loads only its own layers (no registration at import)",
    "tests/test_config_path.py::test_the_config_never_climbs_back_up_and_seldom_comes_back[new]":
        "the set-up's path (its fixture trains 2 steps so that the resume has a checkpoint)",
    "tests/test_config_path.py::test_the_config_never_climbs_back_up_and_seldom_comes_back[resume]":
        "the resume's set-up path",
    "tests/test_notebooks.py::test_notebook_runs[head_ablation-notebook_model]":
        "a notebook in smoke mode, training its own tiny model in the kernel",
}
