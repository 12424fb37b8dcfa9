"""Does the target answer from the served prompt as it does from the full one?

`python -m pflash_lab.bench.answer_parity [--target embedded:gemma3-270m] [--set KEY=VALUE ...]`

Why: the bench families measure whether the evidence is *served*; a weak target can still
answer worse from a prompt cut into many small pieces. Each case is a license text from
`/usr/share/common-licenses` (the first 6,000 characters) with a numbered needle at two
depths, asked for at the end; the target greedily answers from the full prompt and from
the prompt each variant serves (in process, `pflash compress`'s path, keep 0.15). A case
counts when the needle's number is in the first 12 generated tokens. Variants: `off`
(entity feedback and passage cuts off) and `on` (both on), plus any `--set` overrides on both.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

LICENSES = ("GPL-3", "Apache-2.0", "LGPL-3", "MPL-2.0", "GPL-2")
ITEMS = ("quokka", "lantern", "harbor", "violin", "glacier")
DEPTHS = (0.3, 0.7)
VARIANTS = {
    "off": {"select_entity_feedback": False, "select_passage_cuts": False},
    "on": {"select_entity_feedback": True, "select_passage_cuts": True},
}


def cases(seed: int = 5) -> list[tuple[str, str, str, str, str]]:
    """(name, prompt, needle, number, question) per license and depth; deterministic in `seed`."""
    rng = random.Random(seed)
    out = []
    for name in LICENSES:
        for depth in DEPTHS:
            item, number = rng.choice(ITEMS), str(rng.randrange(1_000_000, 9_999_999))
            needle = f"The special magic {item} number is: {number}."
            question = f"What is the special magic {item} number?"
            body = Path(f"/usr/share/common-licenses/{name}").read_text()[:6000]
            mid = body.index("\n\n", int(len(body) * depth))
            prompt = (
                "Below is a long passage. Answer the question at the end based ONLY on "
                "information in the passage.\n\n"
                + body[:mid]
                + "\n\n"
                + needle
                + body[mid:]
                + "\n\nQuestion: "
                + question
                + "\nAnswer:"
            )
            out.append((f"{name}@{depth}", prompt, needle, number, question))
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    from pflash.cli.compress import CompressFile, compress_request
    from pflash.config import build_config
    from pflash.models.loading import load_causal_lm
    from pflash.models.source import load_tokenizer
    from pflash_lab.bench.harness import parse_overrides

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="embedded:gemma3-270m")
    p.add_argument("--keep", type=float, default=0.15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    extra = parse_overrides(args.set)
    tok = load_tokenizer(args.target)
    model = load_causal_lm(args.target).model

    def answers(prompt: str, special: bool) -> str:
        ids = tok(prompt, return_tensors="pt", add_special_tokens=special)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=12, do_sample=False)
        return tok.decode(out[0, ids.shape[1] :])

    base = {"target": args.target, "mode": "always", "keep_ratio": args.keep, "curve": ()}
    configs = {n: build_config(base | v | extra, env={}) for n, v in VARIANTS.items()}
    tally = dict.fromkeys(("full", *configs), 0)
    all_cases = cases()
    for name, prompt, needle, number, question in all_cases:
        row = {"full": number in answers(prompt, True)}
        for variant, config in configs.items():
            request = CompressFile(prompt=prompt, pflash_query=question, pflash_required=(needle,))
            served = compress_request(request, config).prompt
            row[variant] = number in answers(served, False)
        for k, ok in row.items():
            tally[k] += ok
        print(name, row, flush=True)
    print("answered", {k: f"{v}/{len(all_cases)}" for k, v in tally.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
