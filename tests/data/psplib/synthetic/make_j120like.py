"""Write ``j120like_<seed>.sm``: a synthetic 120-job RCPSP in the PSPLIB ``.sm`` layout.

The PSPLIB j120 set is not bundled with the repository; the time-limit tests need an instance of
that size (122 jobs with the dummy source and sink, 4 renewable resources, durations 1-10,
demands 1-10, a tight resource strength), so this script draws one the way ProGen describes its
parameters. Run from the repository root::

    python tests/data/psplib/synthetic/make_j120like.py 1
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

JOBS, RESOURCES, STRENGTH = 120, 4, 0.1


def generate(seed: int) -> str:
    rng = random.Random(seed)
    n = JOBS + 2
    dur = [0] + [rng.randint(1, 10) for _ in range(JOBS)] + [0]
    dem = [[0] * RESOURCES]
    for _ in range(JOBS):
        used = rng.sample(range(RESOURCES), rng.randint(1, RESOURCES))
        dem.append([rng.randint(1, 10) if k in used else 0 for k in range(RESOURCES)])
    dem.append([0] * RESOURCES)
    succ: list[set[int]] = [set() for _ in range(n)]
    has_pred = [False] * n
    for j in range(2, n - 1):  # jobs are 1..n (1 source, n sink), 0-based here
        lo = max(1, j - 25)
        for p in rng.sample(range(lo, j), min(j - lo, rng.randint(1, 3))) if j > 1 else ():
            succ[p].add(j)
            has_pred[j] = True
    for j in range(1, n - 1):
        if not has_pred[j]:
            succ[0].add(j)
        if not succ[j]:
            succ[j].add(n - 1)
    # earliest-start usage peak per resource, for the resource strength
    es = [0] * n
    for j in range(n):
        for s in succ[j]:
            es[s] = max(es[s], es[j] + dur[j])
    horizon = sum(dur)
    caps = []
    for k in range(RESOURCES):
        use = [0] * (horizon + 1)
        for j in range(n):
            for t in range(es[j], es[j] + dur[j]):
                use[t] += dem[j][k]
        kmin = max(dem[j][k] for j in range(n))
        caps.append(kmin + round(STRENGTH * (max(use) - kmin)))
    out = [
        "*" * 72,
        f"file with basedata            : synthetic j120-like, make_j120like.py seed {seed}",
        f"initial value random generator: {seed}",
        "*" * 72,
        "projects                      :  1",
        f"jobs (incl. supersource/sink ):  {n}",
        f"horizon                       :  {horizon}",
        "RESOURCES",
        f"  - renewable                 :  {RESOURCES}   R",
        "  - nonrenewable              :  0   N",
        "  - doubly constrained        :  0   D",
        "*" * 72,
        "PRECEDENCE RELATIONS:",
        "jobnr.    #modes  #successors   successors",
    ]
    for j in range(n):
        s = sorted(succ[j])
        out.append(f"{j + 1:4d}        1         {len(s):2d}   " + "".join(f"{x + 1:4d}" for x in s))
    out += [
        "*" * 72,
        "REQUESTS/DURATIONS:",
        "jobnr. mode duration  " + "  ".join(f"R {k + 1}" for k in range(RESOURCES)),
        "-" * 72,
    ]
    for j in range(n):
        out.append(f"{j + 1:3d}      1    {dur[j]:2d}    " + "".join(f"{d:5d}" for d in dem[j]))
    out += [
        "*" * 72,
        "RESOURCEAVAILABILITIES:",
        "  " + "  ".join(f"R {k + 1}" for k in range(RESOURCES)),
        "  " + "".join(f"{c:5d}" for c in caps),
        "*" * 72,
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    path = Path(__file__).resolve().parent / f"j120like_{seed}.sm"
    path.write_text(generate(seed))
    print(path)
