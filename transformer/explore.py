"""The attention explorer's command line: a checkpoint (or Hugging Face folder) and prompts -> an HTML page.

    python -m transformer.explore --workdir runs/shakespeare --prompt "ROMEO:" --out explorer.html"""

from __future__ import annotations

import argparse

from transformer.analysis.explore import check_page_path, explore


def main(argv: list[str] | None = None) -> None:
    """The command line: a run's checkpoint (or a Hugging Face folder) and prompts -> a page."""
    parser = argparse.ArgumentParser(prog="python -m transformer.explore", description="An interactive attention explorer: one self-contained HTML page.")
    parser.add_argument("--workdir", help="a training run's folder (holding checkpoints/)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    parser.add_argument("--hf_dir", help="a local Hugging Face model folder, instead of --workdir")
    parser.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for more")
    parser.add_argument("--top_k", type=int, default=10, help="next tokens listed (default 10)")
    parser.add_argument("--max_tokens", type=int, default=96, help="longest prompt in tokens (default 96)")
    parser.add_argument("--out", default="explorer.html", help="the page to write (default explorer.html)")
    args = parser.parse_args(argv)
    from absl import logging

    from transformer.cli import exit_with_error
    from transformer.load import load_model
    from transformer.run.checkpoint import CheckpointError, quiet_checkpoint_failures
    from transformer.sampling.text import command_line_text

    logging.set_verbosity(logging.ERROR)  # orbax logs every restore
    quiet_checkpoint_failures()  # one-line errors for a checkpoint that cannot be read or written
    try:
        check_page_path(args.out)  # a bad --out or number fails before any loading
        check_numbers(args, parser)
        prompts = [command_line_text(p, "--prompt") for p in args.prompt]
        cfg, params, tokenizer = load_model(args.workdir, args.hf_dir, args.step)
        ex = explore(params, prompts, cfg=cfg, tokenizer=tokenizer, top_k=args.top_k,
                     max_tokens=args.max_tokens)
        path = ex.save(args.out)
    except (FileNotFoundError, CheckpointError, ValueError) as e:
        exit_with_error(e)
    print(f"wrote {path}: {len(ex.prompts)} prompt(s), {cfg.num_layers} layers x {cfg.num_heads} heads, "
          f"{len(ex.masks)} head masks precomputed")


def check_numbers(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Raises ValueError naming a number flag out of its range and the fix."""
    for name in ("top_k", "max_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} {getattr(args, name)} must be at least 1 "
                             f"(the default is {parser.get_default(name)})")
    if args.step is not None and args.step < 0:
        raise ValueError(f"--step {args.step}: checkpoint steps are >= 0; leave --step out for the latest")


if __name__ == "__main__":
    main()
