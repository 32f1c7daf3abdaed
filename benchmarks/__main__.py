"""``python -m benchmarks --list``; ``python -m benchmarks NAME -n N [--transport T] [args]``.

The second form runs ``python launch.py -n N [--transport T] benchmarks/osu_NAME.py args``
(``reference`` runs without the launcher).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from benchmarks import GROUPS, names, script_path, summary


def main(argv: list[str] | None = None) -> int:
    """List the benchmarks, or run one under the launcher; return the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--list", action="store_true", help="list the benchmarks")
    p.add_argument("name", nargs="?", help="benchmark to run (e.g. allreduce)")
    p.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--transport", choices=("auto", "shm", "tcp"), default="auto")
    args, rest = p.parse_known_args(argv)
    if args.list or not args.name:
        for group, members in GROUPS.items():
            print(f"{group}:")
            for n in members:
                script = "reference.py" if n == "reference" else f"osu_{n}.py"
                print(f"  {script:<22} {summary(n)}")
        print("\nrun: python launch.py -n N [--transport shm|tcp] benchmarks/osu_NAME.py "
              "[options]   (options: -h)\ncompare: python -m benchmarks.compare NAME -n N")
        return 0
    if args.name.removeprefix("osu_") not in names():
        p.error(f"unknown benchmark {args.name!r}; see --list")
    script = script_path(args.name)
    root = os.path.dirname(os.path.dirname(script))
    if args.name == "reference":
        cmd = [sys.executable, script, *rest]
    else:
        cmd = [sys.executable, os.path.join(root, "launch.py"), "-n", str(args.n),
               "--transport", args.transport, script, *rest]
    return subprocess.call(cmd, cwd=root)


if __name__ == "__main__":
    sys.exit(main())
