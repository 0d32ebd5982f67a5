"""python3 -m flashcourse: the stages built, each with its dtype, variants, backward pass and
decode."""

import sys

from . import LibraryNotBuiltError, library_dir, stages


def main() -> int:
    try:
        built = stages()
    except (LibraryNotBuiltError, RuntimeError) as e:
        print(f"flashcourse: {e}", file=sys.stderr)
        return 1
    print(f"{len(built)} stages in {library_dir()}:")
    for s in built:
        bwd = ("  (+ backward pass)" if s.backward else "") + ("  (+ decode)" if s.decode else "")
        print(f"  {s.name:22s} {s.dtype:8s} variants: {', '.join(s.variants)}{bwd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
